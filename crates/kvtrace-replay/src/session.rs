//! The client sessions a storage trace implies, and what the server does at their end that
//! the trace does not record.
//!
//! An LMCache 0.5.6 server handles each client request as a session: a retrieve is a lookup
//! (`submit_prefetch_task`) followed, when anything hit, by the read
//! (`read_prefetched_results` entry and exit, `finish_read_prefetched`); a store is a
//! `reserve_write` followed by `finish_write` of what was reserved. When the client ends the
//! session, the server touches every key of the request in L1 (`touch_l1_keys`, untraced):
//! an eviction-policy event as real as any recorded call — it is what puts a freshly stored
//! chunk into ARC's frequent list. Replay applies that touch a moment after the session's
//! last record (`SESSION_END_DELAY_S`, as the end-of-session call lands on the server).
//!
//! A what-if replay also has to do what the client would have done with a different
//! outcome: when the replay reserved keys the recording could not (so the trace has no
//! `finish_write` for them), the client writes them; when the replay kept read locks for
//! hits the recording did not have (so the trace has no `finish_read_prefetched` for them),
//! the client releases them. Without that, a what-if replay would leak reservations and
//! locks until their TTLs and report eviction stalls no server would have. Both are counted
//! in the report. With the recorded configuration and outcome, nothing is added.

use crate::storage::{KeyId, KeyMap, PrefetchOutcome, StorageManager};

use super::client::{ClientInfo, ClientModel, Rewrite};
use super::dispatch::{Call, Effect};
use super::loaded::Loaded;

/// How long after a session's last record the server's end-of-session touch lands
/// (measured on the reference recordings: 1–7 ms).
pub const SESSION_END_DELAY_S: f64 = 0.002;

/// Where a record sits in the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Position {
    /// 1-based record number.
    pub record: u64,
    /// Byte offset of the record's frame.
    pub offset: u64,
    pub t: f64,
}

/// A finished retrieve: what the recording and the replay hit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Retrieve {
    pub at: Position,
    /// The first key group's keys, in chunk order.
    pub keys: Vec<KeyId>,
    /// What the replay's prefetch found; `recorded_hit_chunks` is what the recording's was:
    /// the keys of its read, 0 when the trace has none.
    pub outcome: PrefetchOutcome,
    /// When the lookup returned: its record's time plus the call's replay latency.
    pub lookup_end: f64,
    /// The read (`read_prefetched_results` entry to the end of the session's last read
    /// call), when the session had one.
    pub read: Option<(f64, f64)>,
}

/// A finished store: what the recording and the replay reserved.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Store {
    pub at: Position,
    pub keys: Vec<KeyId>,
    /// Keys the replay reserved.
    pub replayed: Vec<KeyId>,
    /// Keys the recording admitted (its `finish_write`), i.e. the ones its server reserved.
    pub recorded: Vec<KeyId>,
    /// When the session's last call returned (its record's time plus its replay latency).
    pub end: f64,
}

/// A session that ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Closed {
    Retrieve(Retrieve),
    Store(Store),
}

/// Client work the replay did on the recording's behalf (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Completions {
    /// Keys the replay reserved that the trace never finished, admitted at the session's end.
    pub writes_finished: u64,
    /// Read locks the replay held that the trace never released, released at the end.
    pub locks_released: u64,
    /// End-of-session touches applied.
    pub touches: u64,
}

enum Open {
    Retrieve {
        session: Retrieve,
        /// Every key of the request (all groups), touched at the end.
        all_keys: Vec<KeyId>,
        held: Vec<KeyId>,
        readers: u64,
        released: KeyMap<u64>,
        read_seen: bool,
        entered_ok: bool,
        /// The lookup, to the client model.
        lookup: u64,
    },
    Store {
        session: Store,
        finished: bool,
        /// The keys of the `finish_write` the replay applied (the client model's when it
        /// rewrote the recorded one).
        applied: Vec<KeyId>,
        /// What the end of the session touches: the whole prompt up to the store's last
        /// chunk (LMCache touches every chunk of the session's tokens).
        touch: Vec<KeyId>,
    },
}

/// How a replay follows the recorded client's sessions.
#[derive(Clone, Debug, Default)]
pub struct SessionModel {
    /// Apply the server's end-of-session touch and the client's completions.
    pub emulate: bool,
    /// The model of the recorded client (see [`super::client`]).
    pub client: ClientInfo,
}

/// Follows the trace's sessions; see the module documentation.
pub struct Sessions<'a> {
    /// Apply the end-of-session touch and the client's completions.
    emulate: bool,
    open: Option<(Open, f64)>,
    pub completions: Completions,
    client: ClientModel<'a>,
    /// Replaying a loaded trace: a record's position is its number in it.
    loaded: bool,
}

/// Each of `keys` with whether `of` holds it. A session's lists are in chunk order (a read
/// names a prefix of its lookup's keys, a `finish_write` a subsequence of its reservation's),
/// so each search starts just after the last match and wraps around: linear in the usual
/// case, where a search from the start each time was quadratic, and exact in any case.
pub(crate) fn membership<'a>(
    keys: &'a [KeyId],
    of: &'a [KeyId],
) -> impl Iterator<Item = (KeyId, bool)> + 'a {
    let mut from = 0;
    keys.iter().map(move |&key| {
        let (head, tail) = of.split_at(from);
        let found = match tail.iter().position(|&k| k == key) {
            Some(i) => Some(from + i),
            None => head.iter().position(|&k| k == key),
        };
        if let Some(i) = found {
            from = i + 1;
        }
        (key, found.is_some())
    })
}

fn subset(keys: &[KeyId], of: &[KeyId]) -> bool {
    membership(keys, of).all(|(_, held)| held)
}

impl<'a> Sessions<'a> {
    /// Follows the sessions of a trace read as it comes, or of `loaded`'s records in order
    /// (each record's [`Position::record`] its number there).
    pub fn new(model: &SessionModel, loaded: Option<&'a Loaded>) -> Sessions<'a> {
        Sessions {
            emulate: model.emulate,
            open: None,
            completions: Completions::default(),
            client: ClientModel::new(model.client.clone(), loaded),
            loaded: loaded.is_some(),
        }
    }

    /// `at`'s record in the loaded trace (0-based), when replaying one.
    fn loaded_record(&self, at: Position) -> Option<u64> {
        self.loaded.then(|| at.record.saturating_sub(1))
    }

    /// What the client model sends instead of the recorded `call` (after [`Sessions::before`],
    /// which may have ended the lookup the call's store belongs to).
    pub fn rewrite(&mut self, call: &Call) -> Rewrite {
        self.client.rewrite(call)
    }

    /// What the client model changed so far.
    pub fn client_report(&self) -> &super::client::ClientReport {
        &self.client.report
    }

    /// Before `call` at `at` is applied: ends the open session unless the call continues
    /// it.
    pub fn before(&mut self, sm: &mut StorageManager, call: &Call, at: Position) -> Option<Closed> {
        let continues = match (&self.open, call) {
            (
                Some((Open::Retrieve { all_keys, .. }, _)),
                Call::ReadEnter { keys } | Call::ReadExit { keys } | Call::FinishRead { keys, .. },
            ) => subset(keys, all_keys),
            (
                Some((
                    Open::Store {
                        session, finished, ..
                    },
                    _,
                )),
                Call::FinishWrite { keys },
            ) => !finished && subset(keys, &session.keys),
            _ => false,
        };
        if continues {
            None
        } else {
            self.close(sm, at.t)
        }
    }

    /// After `applied` — the recorded `call`, or what the client model sent instead — took
    /// `effect`: opens a session or records its progress. Follows the session `call` (applied
    /// at `at`, taking `latency_s`) belongs to.
    pub fn after(
        &mut self,
        call: &Call,
        applied: &Call,
        effect: &Effect,
        at: Position,
        latency_s: f64,
    ) {
        let t = at.t;
        let end = t + latency_s;
        match (call, effect) {
            (
                Call::Prefetch {
                    groups, readers, ..
                },
                Effect::Prefetched(outcome),
            ) => {
                let mut outcome = outcome.clone();
                let held = std::mem::take(&mut outcome.held);
                outcome.recorded_hit_chunks = Some(0);
                let lookup = self.client.looked_up(groups, self.loaded_record(at));
                let session = Retrieve {
                    at,
                    keys: groups.first().map(|g| g.keys.clone()).unwrap_or_default(),
                    outcome,
                    lookup_end: end,
                    read: None,
                };
                self.open = Some((
                    Open::Retrieve {
                        session,
                        all_keys: call.keys().collect(),
                        held,
                        readers: (*readers).max(1),
                        released: KeyMap::default(),
                        read_seen: false,
                        entered_ok: true,
                        lookup,
                    },
                    t,
                ));
            }
            (Call::ReserveWrite { keys, .. }, Effect::Reserved(r)) => {
                let session = Store {
                    at,
                    keys: keys.clone(),
                    replayed: r.reserved.clone(),
                    recorded: Vec::new(),
                    end,
                };
                // `applied` is `call` itself unless the client model replaced it: then its keys
                // are the model's, not the record's.
                let (stored, record) = match applied {
                    Call::ReserveWrite { keys: stored, .. } if !std::ptr::eq(applied, call) => {
                        (stored, None)
                    }
                    _ => (keys, self.loaded_record(at)),
                };
                // Only the end-of-session touch needs it.
                let touch = if self.emulate {
                    self.client.store_touch(stored, record)
                } else {
                    Vec::new()
                };
                self.open = Some((
                    Open::Store {
                        session,
                        finished: false,
                        applied: Vec::new(),
                        touch,
                    },
                    t,
                ));
            }
            _ => {
                let Some((open, last)) = &mut self.open else {
                    return;
                };
                *last = t;
                match &mut *open {
                    Open::Retrieve { session, .. } => {
                        if let Some(read) = &mut session.read {
                            read.1 = end;
                        } else if matches!(call, Call::ReadEnter { .. }) {
                            session.read = Some((t, end));
                        }
                    }
                    Open::Store { session, .. } => session.end = end,
                }
                match (open, call) {
                    (
                        Open::Retrieve {
                            session,
                            read_seen,
                            entered_ok,
                            ..
                        },
                        Call::ReadEnter { keys },
                    ) => {
                        *entered_ok = matches!(effect, Effect::Read { ok: true });
                        if !*read_seen {
                            *read_seen = true;
                            let hit = membership(keys, &session.keys)
                                .filter(|&(_, held)| held)
                                .count();
                            session.outcome.recorded_hit_chunks = Some(hit as u64);
                        }
                    }
                    (
                        Open::Retrieve { held, released, .. },
                        Call::FinishRead { keys, read_locks },
                    ) => {
                        for (k, _) in membership(keys, held).filter(|&(_, held)| held) {
                            *released.entry(k).or_default() += (*read_locks).max(1) as u64;
                        }
                    }
                    (
                        Open::Retrieve {
                            held,
                            released,
                            entered_ok: false,
                            ..
                        },
                        Call::ReadExit { keys },
                    ) => {
                        // The exit of a failed read released one lock of each readable key.
                        for (k, _) in membership(keys, held).filter(|&(_, held)| held) {
                            *released.entry(k).or_default() += 1;
                        }
                    }
                    (
                        Open::Store {
                            session,
                            finished,
                            applied: finish,
                            ..
                        },
                        Call::FinishWrite { keys },
                    ) => {
                        *finished = true;
                        session.recorded = keys.clone();
                        *finish = match applied {
                            Call::FinishWrite { keys: finished } => finished.clone(),
                            _ => keys.clone(),
                        };
                    }
                    _ => {}
                }
            }
        }
    }

    /// Ends the open session (at the end of the trace, or before a call that does not
    /// continue it): the client's completions, then the end-of-session touch.
    pub fn close(&mut self, sm: &mut StorageManager, next_t: f64) -> Option<Closed> {
        let (open, last) = self.open.take()?;
        if self.emulate {
            sm.advance_to((last + SESSION_END_DELAY_S).min(next_t));
        }
        match open {
            Open::Retrieve {
                session,
                all_keys,
                held,
                readers,
                released,
                lookup,
                ..
            } => {
                if self.emulate {
                    for key in held {
                        let left = readers.saturating_sub(released.get(&key).copied().unwrap_or(0));
                        if left > 0 && sm.holds_read_lock(key) {
                            sm.finish_read_prefetched(&[key], left as i64);
                            self.completions.locks_released += 1;
                        }
                    }
                    self.touch(sm, &all_keys);
                }
                let o = &session.outcome;
                let recorded = o.recorded_hit_chunks.unwrap_or(0);
                if let Some(store) = self.client.retrieve_closed(lookup, recorded, o.hit_chunks) {
                    // The store the modelled client makes right after its lookup: all or
                    // nothing as any reservation, finished at once, and its session's end.
                    let r = sm.reserve_write(&store.keys, store.object_bytes);
                    if !r.reserved.is_empty() {
                        // A tier that refuses the write-through counts it among its errors.
                        let _ = sm.finish_write(&r.reserved);
                    }
                    if self.emulate {
                        sm.advance_to((sm.now() + SESSION_END_DELAY_S).min(next_t));
                        self.touch(sm, &store.prompt);
                    }
                }
                Some(Closed::Retrieve(session))
            }
            Open::Store {
                session,
                applied,
                touch,
                ..
            } => {
                if self.emulate {
                    let unfinished: Vec<KeyId> = membership(&session.replayed, &applied)
                        .filter_map(|(k, finished)| (!finished).then_some(k))
                        .collect();
                    if !unfinished.is_empty() {
                        if let Ok(admitted) = sm.finish_write(&unfinished) {
                            self.completions.writes_finished += admitted.len() as u64;
                        }
                    }
                    self.touch(sm, &touch);
                }
                Some(Closed::Store(session))
            }
        }
    }

    fn touch(&mut self, sm: &mut StorageManager, keys: &[KeyId]) {
        sm.touch_keys(keys);
        self.completions.touches += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_is_contains_whatever_the_order() {
        // Every ordered pair of small lists over four keys, repeats included.
        let lists: Vec<Vec<KeyId>> = (0..256u32)
            .flat_map(|code| {
                (0..=4).map(move |len| {
                    (0..len)
                        .map(|i| KeyId(((code >> (2 * i)) & 3).into()))
                        .collect()
                })
            })
            .collect();
        for keys in lists.iter().step_by(3) {
            for of in lists.iter().step_by(7) {
                let expected: Vec<(KeyId, bool)> =
                    keys.iter().map(|k| (*k, of.contains(k))).collect();
                assert_eq!(
                    membership(keys, of).collect::<Vec<_>>(),
                    expected,
                    "{keys:?} in {of:?}"
                );
            }
        }
    }
}
