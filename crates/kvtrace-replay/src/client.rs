//! The recorded client, modelled: what it would have stored had the cache answered as the
//! replay's does.
//!
//! A storage trace records what one client did with one server's answers. When the replay's
//! cache answers differently (another L1 size, policy or tier), a real client would have acted
//! differently too, and a replay that re-issues the recorded stores call for call predicts a
//! server nobody could run. The client's *shape* says how it stores after a lookup:
//!
//! - **vllm** — vLLM's LMCache multi-process connector stores only the chunks after the hit
//!   prefix (the hit tokens "are NOT re-stored"): a lookup of `n` chunks that hit `h` is
//!   followed by a store of chunks `h..n`, and a full hit stores nothing. Replayed with another
//!   configuration, a lookup that hits `h'` instead makes the store `h'..n`: grown where the
//!   replay hit less, shrunk where it hit more, dropped where it hit everything, and added
//!   right after the lookup's session where the recording hit everything and so stored nothing.
//! - **sdk** — LMCache's SDK `store` names the whole prompt; the server's `reserve_write`
//!   decides what is written (resident keys are not writable). The recorded calls are already
//!   what the client would send whatever the cache holds, so they are replayed as recorded.
//! - **literal** — every recorded call as it was, nothing added or dropped (LMCache's own
//!   `trace replay`).
//!
//! The shape is inferred from the head of the trace (each store's keys against the lookup
//! whose chunks they are) or named by the caller.
//!
//! Keys carry no token ids, so a store is tied to its lookup by its keys: a chunk's key
//! hashes the chunk's tokens and every token before them, so the chunk whose key a store
//! begins with sits at the same place in every lookup that names it, behind the same prefix.
//! The same tie gives the server's end of a store's session its keys: LMCache touches every
//! chunk of the session's tokens — the whole prompt, the hit prefix a vLLM store leaves out
//! included (`format-spec/REPLAY.md` §5.1).

use std::collections::VecDeque;

use serde::Serialize;

use crate::error::Result;
use crate::lmct::ReadOptions;
use crate::storage::{KeyId, KeyMap, KeySet, PrefetchGroup};

use super::dispatch::Call;
use super::loaded::Loaded;
use super::session::membership;
use super::Source;

/// How the recorded client stores after a lookup (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    Vllm,
    Sdk,
    Literal,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Vllm => "vllm",
            Shape::Sdk => "sdk",
            Shape::Literal => "literal",
        }
    }
}

/// Which client model a replay runs.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientChoice {
    /// Infer the shape from the head of the trace ([`infer`]).
    Infer,
    /// The caller named it.
    Given(Shape),
    /// Already inferred or given (a plan resolves the choice once for the phase estimate and
    /// the replay).
    Resolved(ClientInfo),
}

/// The client model a replay ran, and why that one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClientInfo {
    pub model: Shape,
    /// `inferred` or `given`.
    pub source: &'static str,
    /// What the inference saw, in words.
    pub evidence: String,
}

impl Default for ClientInfo {
    fn default() -> Self {
        ClientInfo {
            model: Shape::Literal,
            source: "given",
            evidence: String::new(),
        }
    }
}

/// What the client model changed, summed over the replay.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClientReport {
    #[serde(flatten)]
    pub info: ClientInfo,
    /// Stores the recorded client did not make that the modelled one did (the recording hit
    /// the whole prompt, the replay did not), and the keys they named.
    pub stores_added: u64,
    pub keys_added_by_new_stores: u64,
    /// Recorded stores the modelled client would not have made (the replay hit the whole
    /// prompt), and their keys.
    pub stores_dropped: u64,
    pub keys_dropped_with_stores: u64,
    /// Recorded stores that named other chunks, and the keys they gained and lost.
    pub stores_resized: u64,
    pub keys_added: u64,
    pub keys_dropped: u64,
}

/// Why a recorded call was not replayed: the modelled client would not have made it.
pub const DROPPED: &str =
    "the client model would not have made this call (the replay hit the whole prompt)";

/// Records read to infer the shape: the phase estimate's head of the trace.
const INFER_RECORDS: usize = super::phase::ESTIMATE_RECORDS;

/// Resolves a choice: infers the shape from the head of the trace when asked to (once for a
/// loaded trace, whatever the number of replays).
pub fn resolve(source: Source<'_>, read: ReadOptions, choice: &ClientChoice) -> Result<ClientInfo> {
    match choice {
        ClientChoice::Resolved(info) => Ok(info.clone()),
        ClientChoice::Given(shape) => Ok(ClientInfo {
            model: *shape,
            source: "given",
            evidence: String::new(),
        }),
        ClientChoice::Infer => match source {
            Source::File(path) => infer(path, read),
            Source::Loaded(loaded) => Ok(loaded.client(|| infer_head(loaded))),
        },
    }
}

/// Infers the recorded client's shape from the stores in the head of the trace: stores that
/// begin at their lookup's hit prefix after a partial hit are vLLM's, stores of the whole
/// prompt after a partial hit are the SDK's. A trace where neither outnumbers the other ten
/// to one, or with neither (no lookup that hit part of its prompt and was followed by a store
/// of it), is replayed literally.
pub fn infer(path: &std::path::Path, read: ReadOptions) -> Result<ClientInfo> {
    Ok(infer_head(&Loaded::load_head(path, read, INFER_RECORDS)?))
}

/// [`infer`] from a trace's head decoded before.
fn infer_head(loaded: &Loaded) -> ClientInfo {
    let head = loaded.head(INFER_RECORDS, usize::MAX);
    infer_from(head.iter().map(|(_, call)| call))
}

/// [`infer`] from the decoded calls of the head of a trace.
fn infer_from<'a>(head: impl Iterator<Item = &'a Call>) -> ClientInfo {
    let mut prompts = Prompts::default();
    let (mut tail, mut whole, mut last_lookup) = (0u64, 0u64, None::<u64>);
    for call in head {
        match call {
            Call::Prefetch { groups, .. } => last_lookup = Some(prompts.add(groups)),
            Call::ReadEnter { keys } => {
                // The lookup's read names what the recording hit.
                if let Some(prompt) = last_lookup.take().and_then(|seq| prompts.get_mut(seq)) {
                    prompt.hit = membership(keys, prompt.first_group())
                        .filter(|&(_, held)| held)
                        .count();
                }
            }
            Call::ReserveWrite { keys, .. } => {
                last_lookup = None;
                let Some((seq, start, _)) = prompts.locate(keys) else {
                    continue;
                };
                let hit = prompts.get(seq).map_or(0, |p| p.hit);
                if hit == 0 {
                    continue;
                }
                if start == hit {
                    tail += 1;
                } else if start == 0 {
                    whole += 1;
                }
            }
            _ => {}
        }
    }
    let seen = format!(
        "{tail} store(s) began at their lookup's hit prefix, {whole} named the whole prompt after a partial hit"
    );
    // Ten to one: a few stores of the other shape (two requests for one prompt in flight at
    // once) do not change what the client is; an even mix says neither model fits.
    let model = if tail > 0 && tail >= 10 * whole {
        Shape::Vllm
    } else if whole > 0 && whole >= 10 * tail {
        Shape::Sdk
    } else {
        Shape::Literal
    };
    ClientInfo {
        model,
        source: "inferred",
        evidence: seen,
    }
}

/// How many recent lookups a store can be tied to: the requests a server has in flight
/// between a lookup and its store.
const PROMPTS: usize = 1024;

/// One lookup's prompt: its key groups, chunk by chunk.
struct Prompt {
    seq: u64,
    groups: Vec<Vec<KeyId>>,
    object_bytes: u64,
    /// The chunks the recording hit (for the inference only).
    hit: usize,
}

impl Prompt {
    fn first_group(&self) -> &[KeyId] {
        self.groups.first().map_or(&[], Vec::as_slice)
    }

    /// Chunks `from..` of every group, group by group: the keys of a store of those chunks.
    fn tail(&self, from: usize) -> Vec<KeyId> {
        self.groups
            .iter()
            .flat_map(|g| g.get(from..).unwrap_or(&[]).iter().copied())
            .collect()
    }

    /// Chunks `..to` of every group: what the end of a session over those chunks touches.
    fn head(&self, to: usize) -> Vec<KeyId> {
        self.groups
            .iter()
            .flat_map(|g| g[..to.min(g.len())].iter().copied())
            .collect()
    }

    fn chunks(&self) -> usize {
        self.groups.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// The recent lookups, and where each of their keys sits (bounded: the last [`PROMPTS`]).
#[derive(Default)]
struct Prompts {
    ring: VecDeque<Prompt>,
    /// A key's latest lookup and chunk index. An entry whose lookup has left the ring is stale
    /// and reads as absent: entries are not removed as lookups leave (that would cost a map
    /// operation per key of every lookup) but swept when stale ones could outnumber the rest.
    at: KeyMap<(u64, usize)>,
    /// Keys named by the lookups in the ring, repeats included: at least the live entries.
    held: usize,
    next: u64,
}

impl Prompts {
    fn add(&mut self, groups: &[PrefetchGroup]) -> u64 {
        let seq = self.next;
        self.next += 1;
        if self.ring.len() == PROMPTS {
            if let Some(old) = self.ring.pop_front() {
                self.held -= old.groups.iter().map(Vec::len).sum::<usize>();
            }
        }
        let added: usize = groups.iter().map(|g| g.keys.len()).sum();
        self.held += added;
        if self.at.len() + added > 2 * self.held {
            let oldest = self.ring.front().map_or(seq, |p| p.seq);
            self.at.retain(|_, &mut (s, _)| s >= oldest);
        }
        for group in groups {
            for (i, &key) in group.keys.iter().enumerate() {
                self.at.insert(key, (seq, i));
            }
        }
        self.ring.push_back(Prompt {
            seq,
            groups: groups.iter().map(|g| g.keys.clone()).collect(),
            object_bytes: groups.first().map_or(0, |g| g.object_bytes),
            hit: 0,
        });
        seq
    }

    /// A key's lookup and chunk index, while that lookup is in the ring.
    fn at(&self, key: &KeyId) -> Option<(u64, usize)> {
        let front = self.ring.front()?.seq;
        self.at.get(key).copied().filter(|&(s, _)| s >= front)
    }

    fn get(&self, seq: u64) -> Option<&Prompt> {
        let front = self.ring.front()?.seq;
        self.ring
            .get(usize::try_from(seq.checked_sub(front)?).ok()?)
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Prompt> {
        let front = self.ring.front()?.seq;
        self.ring
            .get_mut(usize::try_from(seq.checked_sub(front)?).ok()?)
    }

    /// The lookup a store of `keys` belongs to, the chunk it begins at and the chunk after its
    /// last: the store's keys must all be that lookup's.
    fn locate(&self, keys: &[KeyId]) -> Option<(u64, usize, usize)> {
        let (seq, start) = self.at(keys.first()?)?;
        let prompt = self.get(seq)?;
        let mut end = 0;
        for key in keys {
            match self.at(key) {
                Some((s, i)) if s == seq => end = end.max(i + 1),
                _ => return None,
            }
        }
        (start < prompt.chunks()).then_some((seq, start, end))
    }
}

/// A vLLM store the recording will make: of lookup `seq`, from chunk `recorded` on, where the
/// replay's hit ended at chunk `replayed`.
#[derive(Clone, Copy)]
struct Pending {
    seq: u64,
    recorded: usize,
    replayed: usize,
}

/// The client model of one replay (see the module documentation).
pub struct ClientModel {
    shape: Shape,
    prompts: Prompts,
    /// vLLM stores still to come, by the first key the recorded store names: the lookup, and
    /// the chunks the recording's and the replay's hit prefixes ended at.
    pending: KeyMap<Pending>,
    /// A recorded store being replayed otherwise: its recorded keys and the keys the modelled
    /// client names instead (empty: dropped), until its `finish_write`.
    rewritten: Option<(Vec<KeyId>, Vec<KeyId>)>,
    pub report: ClientReport,
}

/// What the client model makes of a recorded call.
pub enum Rewrite {
    /// Apply it as recorded.
    Keep,
    /// Apply this call instead.
    Replace(Call),
    /// The modelled client would not have made it.
    Drop,
}

/// A store the modelled client makes that the recording has no call for.
pub struct NewStore {
    pub keys: Vec<KeyId>,
    pub object_bytes: u64,
    /// The whole prompt, for the end of the store's session.
    pub prompt: Vec<KeyId>,
}

impl ClientModel {
    pub fn new(info: ClientInfo) -> ClientModel {
        ClientModel {
            shape: info.model,
            prompts: Prompts::default(),
            pending: KeyMap::default(),
            rewritten: None,
            report: ClientReport {
                info,
                ..ClientReport::default()
            },
        }
    }

    /// A lookup was issued; returns its handle for [`ClientModel::retrieve_closed`].
    pub fn looked_up(&mut self, groups: &[PrefetchGroup]) -> u64 {
        self.prompts.add(groups)
    }

    /// What the end of a store session of `keys` touches: every chunk of the prompt up to the
    /// store's last, when the store is tied to a lookup; the store's own keys otherwise.
    pub fn store_touch(&self, keys: &[KeyId]) -> Vec<KeyId> {
        match self.prompts.locate(keys) {
            Some((seq, _, end)) => self.prompts.get(seq).map(|p| p.head(end)),
            None => None,
        }
        .unwrap_or_else(|| keys.to_vec())
    }

    /// A retrieve session ended: the recording hit `recorded` chunks of the lookup, the
    /// replay `replayed`. Under the vLLM shape, either the recorded store of the missed
    /// chunks is now expected, or — where the recording hit the whole prompt and so stored
    /// nothing — the store the client would have made now is returned.
    pub fn retrieve_closed(&mut self, seq: u64, recorded: u64, replayed: u64) -> Option<NewStore> {
        if self.shape != Shape::Vllm {
            return None;
        }
        let prompt = self.prompts.get(seq)?;
        let n = prompt.first_group().len();
        let (recorded, replayed) = (recorded as usize, replayed as usize);
        if recorded < n {
            let first = prompt.first_group()[recorded];
            if self.pending.len() >= 2 * PROMPTS {
                // Stores that never came (an aborted request): forget those whose lookup
                // has left the window a store can be tied to.
                let oldest = self.prompts.ring.front().map_or(0, |p| p.seq);
                self.pending.retain(|_, p| p.seq >= oldest);
            }
            let pending = Pending {
                seq,
                recorded,
                replayed,
            };
            self.pending.insert(first, pending);
            return None;
        }
        if replayed >= n {
            return None;
        }
        let keys = prompt.tail(replayed);
        self.report.stores_added += 1;
        self.report.keys_added_by_new_stores += keys.len() as u64;
        Some(NewStore {
            prompt: prompt.head(n),
            object_bytes: prompt.object_bytes,
            keys,
        })
    }

    /// What the modelled client sends instead of the recorded `call`.
    pub fn rewrite(&mut self, call: &Call) -> Rewrite {
        match call {
            Call::ReserveWrite { keys, object_bytes } => {
                self.rewritten = None;
                let Some(Pending {
                    seq,
                    recorded,
                    replayed,
                }) = keys.first().and_then(|k| self.pending.remove(k))
                else {
                    return Rewrite::Keep;
                };
                let Some(prompt) = self.prompts.get(seq) else {
                    return Rewrite::Keep;
                };
                if replayed == recorded || prompt.tail(recorded) != *keys {
                    return Rewrite::Keep;
                }
                let wanted = prompt.tail(replayed);
                self.rewritten = Some((keys.clone(), wanted.clone()));
                if wanted.is_empty() {
                    self.report.stores_dropped += 1;
                    self.report.keys_dropped_with_stores += keys.len() as u64;
                    return Rewrite::Drop;
                }
                self.report.stores_resized += 1;
                let gained = membership(&wanted, keys).filter(|&(_, had)| !had).count();
                let lost = membership(keys, &wanted).filter(|&(_, kept)| !kept).count();
                self.report.keys_added += gained as u64;
                self.report.keys_dropped += lost as u64;
                Rewrite::Replace(Call::ReserveWrite {
                    keys: wanted,
                    object_bytes: *object_bytes,
                })
            }
            Call::FinishWrite { keys } => {
                let Some((recorded, wanted)) = &self.rewritten else {
                    return Rewrite::Keep;
                };
                if !membership(keys, recorded).all(|(_, ours)| ours) {
                    return Rewrite::Keep;
                }
                if wanted.is_empty() {
                    return Rewrite::Drop;
                }
                // What the recording's server did not admit of its own keys stays out; the
                // chunks the modelled client added are finished with the rest, in order.
                let recorded: KeySet = recorded.iter().copied().collect();
                let finished: KeySet = keys.iter().copied().collect();
                let finish: Vec<KeyId> = wanted
                    .iter()
                    .copied()
                    .filter(|k| !recorded.contains(k) || finished.contains(k))
                    .collect();
                Rewrite::Replace(Call::FinishWrite { keys: finish })
            }
            _ => Rewrite::Keep,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(range: std::ops::Range<u32>) -> Vec<KeyId> {
        range.map(|i| KeyId(u128::from(i) + 1)).collect()
    }

    fn lookup(model: &mut ClientModel, n: u32) -> u64 {
        model.looked_up(&[PrefetchGroup {
            keys: keys(0..n),
            object_bytes: 4096,
            chunk_tokens: Some(64),
            window: -1,
        }])
    }

    fn vllm() -> ClientModel {
        ClientModel::new(ClientInfo {
            model: Shape::Vllm,
            ..ClientInfo::default()
        })
    }

    fn reserve(k: Vec<KeyId>) -> Call {
        Call::ReserveWrite {
            keys: k,
            object_bytes: 4096,
        }
    }

    #[test]
    fn a_vllm_store_follows_the_replayed_hit_prefix() {
        // Recorded: 6 chunks, 2 hit, store 2..6. The replay hit 1: the store grows to 1..6,
        // and its finish_write with it.
        let mut m = vllm();
        let seq = lookup(&mut m, 6);
        assert!(m.retrieve_closed(seq, 2, 1).is_none());
        let Rewrite::Replace(Call::ReserveWrite { keys: grown, .. }) =
            m.rewrite(&reserve(keys(2..6)))
        else {
            panic!("the store is not resized");
        };
        assert_eq!(grown, keys(1..6));
        let Rewrite::Replace(Call::FinishWrite { keys: finished }) =
            m.rewrite(&Call::FinishWrite { keys: keys(2..6) })
        else {
            panic!("the finish is not resized");
        };
        assert_eq!(finished, keys(1..6));
        assert_eq!((m.report.stores_resized, m.report.keys_added), (1, 1));

        // The replay hit 4 of a lookup the recording hit 2 of: the store shrinks to 4..6.
        let seq = lookup(&mut m, 6);
        m.retrieve_closed(seq, 2, 4);
        let Rewrite::Replace(Call::ReserveWrite { keys: shrunk, .. }) =
            m.rewrite(&reserve(keys(2..6)))
        else {
            panic!("the store is not resized");
        };
        assert_eq!(shrunk, keys(4..6));

        // The replay hit everything: the store and its finish are not made.
        let seq = lookup(&mut m, 6);
        m.retrieve_closed(seq, 2, 6);
        assert!(matches!(m.rewrite(&reserve(keys(2..6))), Rewrite::Drop));
        assert!(matches!(
            m.rewrite(&Call::FinishWrite { keys: keys(2..6) }),
            Rewrite::Drop
        ));
        assert_eq!(m.report.stores_dropped, 1);

        // The recording hit everything (no store follows), the replay 3: a store of 3..6 is
        // made right away, and its session touches the whole prompt.
        let seq = lookup(&mut m, 6);
        let added = m.retrieve_closed(seq, 6, 3).expect("a new store");
        assert_eq!(added.keys, keys(3..6));
        assert_eq!(added.prompt, keys(0..6));
        assert_eq!(added.object_bytes, 4096);
        assert_eq!(m.report.stores_added, 1);
    }

    #[test]
    fn a_store_touches_its_prompt_and_other_shapes_keep_the_recorded_calls() {
        let mut m = ClientModel::new(ClientInfo::default());
        let seq = lookup(&mut m, 5);
        assert!(m.retrieve_closed(seq, 2, 0).is_none());
        assert!(matches!(m.rewrite(&reserve(keys(2..5))), Rewrite::Keep));
        // The session of a store of chunks 2..4 touches chunks 0..4 of its prompt.
        assert_eq!(m.store_touch(&keys(2..4)), keys(0..4));
        // A store of keys no lookup named touches its own keys.
        let stray = keys(100..103);
        assert_eq!(m.store_touch(&stray), stray);
    }

    #[test]
    fn a_store_is_tied_to_a_lookup_only_while_it_is_among_the_last_prompts() {
        let mut m = ClientModel::new(ClientInfo::default());
        let group = |range| PrefetchGroup {
            keys: keys(range),
            object_bytes: 4096,
            chunk_tokens: Some(64),
            window: -1,
        };
        // Lookup i names chunks 10i..10i+10: every key belongs to one lookup.
        let lookups = PROMPTS as u32 + 3 * PROMPTS as u32 / 2;
        for i in 0..lookups {
            m.looked_up(&[group(10 * i..10 * i + 10)]);
            // What the index holds stays within twice the keys of the lookups it remembers.
            let held = m.prompts.held;
            assert!(
                m.prompts.at.len() <= 2 * held,
                "{} > 2 × {held}",
                m.prompts.at.len()
            );
        }
        // The lookups that left the window no longer tie their stores: those touch their own
        // keys, while a store of the oldest lookup still remembered touches its prompt's head.
        let gone = lookups - PROMPTS as u32 - 1;
        let stale = keys(10 * gone + 4..10 * gone + 6);
        assert_eq!(m.store_touch(&stale), stale);
        let oldest = gone + 1;
        let kept = keys(10 * oldest + 4..10 * oldest + 6);
        assert_eq!(m.store_touch(&kept), keys(10 * oldest..10 * oldest + 6));
        // Keys a later lookup names again belong to that lookup: a store of them touches its
        // head, one with a key only the earlier lookup named is tied to neither.
        let last = lookups - 1;
        m.looked_up(&[group(10 * last..10 * last + 4)]);
        assert_eq!(
            m.store_touch(&keys(10 * last + 2..10 * last + 4)),
            keys(10 * last..10 * last + 4)
        );
        let mixed = keys(10 * last + 2..10 * last + 5);
        assert_eq!(m.store_touch(&mixed), mixed);
    }
}
