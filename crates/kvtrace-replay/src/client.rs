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
use super::loaded::{Loaded, LoadedRecord};
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
    infer_from(head.iter().map(|&(_, call)| call))
}

/// [`infer`] from the decoded calls of the head of a trace.
fn infer_from<'a>(head: impl Iterator<Item = &'a Call>) -> ClientInfo {
    let mut prompts = Prompts::default();
    // The chunks the recording hit, by lookup.
    let mut hits = std::collections::HashMap::<u64, usize>::new();
    let (mut tail, mut whole, mut last_lookup) = (0u64, 0u64, None::<u64>);
    for call in head {
        match call {
            Call::Prefetch { groups, .. } => last_lookup = Some(prompts.add(groups)),
            Call::ReadEnter { keys } => {
                // The lookup's read names what the recording hit.
                if let Some(seq) = last_lookup.take() {
                    if let Some(groups) = prompts.get(seq) {
                        let hit = membership(keys, first_group(groups))
                            .filter(|&(_, held)| held)
                            .count();
                        hits.insert(seq, hit);
                    }
                }
            }
            Call::ReserveWrite { keys, .. } => {
                last_lookup = None;
                let Some((seq, start, _)) = prompts.locate(keys) else {
                    continue;
                };
                let hit = hits.get(&seq).copied().unwrap_or(0);
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

/// The chunks of a lookup's groups `from..`, group by group: the keys of a store of those
/// chunks.
fn tail(groups: &[PrefetchGroup], from: usize) -> Vec<KeyId> {
    groups
        .iter()
        .flat_map(|g| g.keys.get(from..).unwrap_or(&[]).iter().copied())
        .collect()
}

/// Chunks `..to` of every group: what the end of a session over those chunks touches.
fn head(groups: &[PrefetchGroup], to: usize) -> Vec<KeyId> {
    groups
        .iter()
        .flat_map(|g| g.keys[..to.min(g.keys.len())].iter().copied())
        .collect()
}

fn first_group(groups: &[PrefetchGroup]) -> &[KeyId] {
    groups.first().map_or(&[], |g| g.keys.as_slice())
}

fn chunks(groups: &[PrefetchGroup]) -> usize {
    groups.iter().map(|g| g.keys.len()).max().unwrap_or(0)
}

/// Ties a store to the lookup its keys belong to: `at` gives, for each of the store's keys in
/// order, its latest lookup still remembered and its chunk there; `chunks` a lookup's length.
/// The lookup of the first key, the chunk the store begins at and the chunk after its last:
/// every key must be that lookup's.
fn tie(
    mut at: impl Iterator<Item = Option<(u64, usize)>>,
    chunks: impl FnOnce(u64) -> Option<usize>,
) -> Option<(u64, usize, usize)> {
    let (seq, start) = at.next()??;
    let chunks = chunks(seq)?;
    let mut end = start + 1;
    for key in at {
        match key {
            Some((s, i)) if s == seq => end = end.max(i + 1),
            _ => return None,
        }
    }
    (start < chunks).then_some((seq, start, end))
}

/// The recent lookups, and where each of their keys sits (bounded: the last [`PROMPTS`]),
/// kept as the lookups come.
#[derive(Default)]
struct Prompts {
    /// The remembered lookups' groups, oldest first; the first is lookup `next - ring.len()`.
    ring: VecDeque<Vec<PrefetchGroup>>,
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
                self.held -= old.iter().map(|g| g.keys.len()).sum::<usize>();
            }
        }
        let added: usize = groups.iter().map(|g| g.keys.len()).sum();
        self.held += added;
        if self.at.len() + added > 2 * self.held {
            let oldest = self.front();
            self.at.retain(|_, &mut (s, _)| s >= oldest);
        }
        for group in groups {
            for (i, &key) in group.keys.iter().enumerate() {
                self.at.insert(key, (seq, i));
            }
        }
        self.ring.push_back(groups.to_vec());
        seq
    }

    /// The oldest lookup remembered (the next one while none is).
    fn front(&self) -> u64 {
        self.next - self.ring.len() as u64
    }

    /// A key's lookup and chunk index, while that lookup is in the ring.
    fn at(&self, key: &KeyId) -> Option<(u64, usize)> {
        let front = self.front();
        self.at.get(key).copied().filter(|&(s, _)| s >= front)
    }

    fn get(&self, seq: u64) -> Option<&[PrefetchGroup]> {
        let at = usize::try_from(seq.checked_sub(self.front())?).ok()?;
        self.ring.get(at).map(Vec::as_slice)
    }

    /// The lookup a store of `keys` belongs to, the chunk it begins at and the chunk after its
    /// last (see [`tie`]).
    fn locate(&self, keys: &[KeyId]) -> Option<(u64, usize, usize)> {
        tie(keys.iter().map(|k| self.at(k)), |seq| {
            self.get(seq).map(chunks)
        })
    }
}

/// No lookup, no next occurrence: the index's sentinel.
const NONE: u32 = u32::MAX;

/// One key of one lookup, in a [`LookupIndex`].
#[derive(Clone, Copy)]
struct Occurrence {
    /// The lookup (its number among the trace's lookups).
    seq: u32,
    /// Its chunk in its group.
    chunk: u32,
    /// The next occurrence of the same key, in the order lookups name keys; [`NONE`] if none.
    next: u32,
}

/// What [`Prompts`] would hold at every point of a loaded trace, worked out once for all of
/// its replays (a sweep's points and curves): which record each lookup is, every lookup key's
/// next occurrence, and the lookup each recorded store is tied to. A replay reads its window
/// of lookups from here instead of inserting every key of every lookup into a map of its own
/// — a fifth of a sweep point's time. Valid while a replay looks up exactly the trace's
/// lookups, in order; a replay that does not (a lookup the replay's server refused) goes back
/// to a window of its own (see [`Window`]). About 12 bytes a lookup key and 12 a record.
pub(crate) struct LookupIndex {
    /// The record of each lookup.
    lookups: Vec<u32>,
    /// Where each lookup's occurrences begin in `occurrences` (one more entry: the end).
    first: Vec<u32>,
    occurrences: Vec<Occurrence>,
    /// By record: the lookup a recorded store's keys are tied to when it is replayed as
    /// recorded, its first chunk and the chunk after its last; `[NONE; 3]` when none.
    ties: Vec<[u32; 3]>,
}

impl LookupIndex {
    /// The index of `records`; `None` when they are too many to number in 32 bits.
    pub(crate) fn build(records: &[LoadedRecord]) -> Option<LookupIndex> {
        let mut index = LookupIndex {
            lookups: Vec::new(),
            first: vec![0],
            occurrences: Vec::new(),
            ties: vec![[NONE; 3]; records.len()],
        };
        // Each key's latest occurrence so far: what a replay's map holds at that record.
        let mut latest = KeyMap::<u32>::default();
        for (r, record) in records.iter().enumerate() {
            match &record.call {
                Ok(Call::Prefetch { groups, .. }) => {
                    let seq = u32::try_from(index.lookups.len()).ok()?;
                    index.lookups.push(u32::try_from(r).ok()?);
                    for group in groups {
                        for (chunk, &key) in group.keys.iter().enumerate() {
                            let at = u32::try_from(index.occurrences.len()).ok()?;
                            if at == NONE {
                                return None;
                            }
                            index.occurrences.push(Occurrence {
                                seq,
                                chunk: u32::try_from(chunk).ok()?,
                                next: NONE,
                            });
                            if let Some(before) = latest.insert(key, at) {
                                index.occurrences[before as usize].next = at;
                            }
                        }
                    }
                    index
                        .first
                        .push(u32::try_from(index.occurrences.len()).ok()?);
                }
                Ok(Call::ReserveWrite { keys, .. }) => {
                    let next = index.lookups.len() as u64;
                    let front = next.saturating_sub(PROMPTS as u64);
                    let at = |key: &KeyId| {
                        let o = index.occurrences[*latest.get(key)? as usize];
                        (u64::from(o.seq) >= front).then_some((u64::from(o.seq), o.chunk as usize))
                    };
                    let tied = tie(keys.iter().map(at), |seq| {
                        index
                            .groups(records, seq)
                            .filter(|_| seq >= front)
                            .map(chunks)
                    });
                    if let Some((seq, start, end)) = tied {
                        index.ties[r] = [
                            u32::try_from(seq).ok()?,
                            u32::try_from(start).ok()?,
                            u32::try_from(end).ok()?,
                        ];
                    }
                }
                _ => {}
            }
        }
        Some(index)
    }

    /// Lookup `seq`'s groups, in the records the index was built of.
    fn groups<'r>(&self, records: &'r [LoadedRecord], seq: u64) -> Option<&'r [PrefetchGroup]> {
        let record = *self.lookups.get(usize::try_from(seq).ok()?)?;
        match &records.get(record as usize)?.call {
            Ok(Call::Prefetch { groups, .. }) => Some(groups),
            _ => None,
        }
    }

    /// Where occurrence `at`'s key sits once lookups `..next` were made: its latest
    /// occurrence among them.
    fn latest(&self, mut at: u32, next: u64) -> (u64, usize) {
        loop {
            let o = self.occurrences[at as usize];
            match self.occurrences.get(o.next as usize) {
                Some(later) if u64::from(later.seq) < next => at = o.next,
                _ => return (u64::from(o.seq), o.chunk as usize),
            }
        }
    }
}

/// The window of recent lookups a replay ties its stores to.
enum Window<'a> {
    /// Kept as the lookups come.
    Own(Prompts),
    /// Read from a loaded trace's index: lookups `..next` were made, each the trace's.
    Indexed {
        records: &'a [LoadedRecord],
        index: &'a LookupIndex,
        next: u64,
    },
}

impl Window<'_> {
    /// Lookup `record` (the loaded trace's record number, when there is one) was made with
    /// `groups`; its number.
    fn add(&mut self, groups: &[PrefetchGroup], record: Option<u64>) -> u64 {
        if let Window::Indexed { index, next, .. } = self {
            let theirs = index.lookups.get(*next as usize).map(|&r| u64::from(r));
            if theirs.is_some() && theirs == record {
                *next += 1;
                return *next - 1;
            }
            self.keep_own();
        }
        match self {
            Window::Own(prompts) => prompts.add(groups),
            Window::Indexed { .. } => unreachable!("keeps its own now"),
        }
    }

    /// From here on, a window of its own, holding what the index held: the replay's lookups
    /// are no longer the trace's.
    fn keep_own(&mut self) {
        let Window::Indexed { next, .. } = *self else {
            return;
        };
        let mut own = Prompts {
            next: next.saturating_sub(PROMPTS as u64),
            ..Prompts::default()
        };
        for seq in own.next..next {
            if let Some(groups) = self.get(seq) {
                own.add(groups);
            }
        }
        *self = Window::Own(own);
    }

    /// The oldest lookup remembered.
    fn front(&self) -> u64 {
        match self {
            Window::Own(prompts) => prompts.front(),
            Window::Indexed { next, .. } => next.saturating_sub(PROMPTS as u64),
        }
    }

    /// Lookup `seq`'s groups, while it is remembered.
    fn get(&self, seq: u64) -> Option<&[PrefetchGroup]> {
        match self {
            Window::Own(prompts) => prompts.get(seq),
            Window::Indexed {
                records,
                index,
                next,
            } => {
                if seq < self.front() || seq >= *next {
                    return None;
                }
                index.groups(records, seq)
            }
        }
    }

    /// The lookup a store of `keys` belongs to, its first chunk and the chunk after its last
    /// (see [`tie`]). `origin` says where the keys came from, which is how the index finds
    /// them.
    fn locate(&mut self, keys: &[KeyId], origin: Option<Origin>) -> Option<(u64, usize, usize)> {
        if let (Window::Indexed { index, next, .. }, Some(Origin::Recorded(record))) =
            (&*self, origin)
        {
            // A record's tie assumes every lookup before it was made; one the replay did
            // not make (its server refused it) leaves the index behind.
            let missed = index.lookups.get(*next as usize);
            if missed.is_some_and(|&r| u64::from(r) < record) {
                self.keep_own();
            }
        }
        match &*self {
            Window::Own(prompts) => prompts.locate(keys),
            Window::Indexed { index, next, .. } => match origin? {
                Origin::Recorded(record) => {
                    let [seq, start, end] = *index.ties.get(record as usize)?;
                    debug_assert_eq!(recorded_keys(self, record), Some(keys));
                    (seq != NONE).then_some((seq.into(), start as usize, end as usize))
                }
                Origin::Tail { seq, from } => {
                    // The tail's keys are the lookup's occurrences from chunk `from` of each
                    // group, which lie one group after another.
                    let mut group_at = index.first[seq as usize];
                    let occurrences = self.get(seq)?.iter().flat_map(|g| {
                        let (n, skip) = (g.keys.len() as u32, from.min(g.keys.len()) as u32);
                        let at = group_at;
                        group_at += n;
                        at + skip..at + n
                    });
                    tie(occurrences.map(|o| Some(index.latest(o, *next))), |seq| {
                        self.get(seq).map(chunks)
                    })
                }
            },
        }
    }
}

/// The keys of loaded record `record`'s store.
fn recorded_keys<'w>(window: &'w Window<'_>, record: u64) -> Option<&'w [KeyId]> {
    let Window::Indexed { records, .. } = window else {
        return None;
    };
    match &records.get(record as usize)?.call {
        Ok(Call::ReserveWrite { keys, .. }) => Some(keys),
        _ => None,
    }
}

/// Where the keys of a store the replay applied came from.
#[derive(Clone, Copy)]
enum Origin {
    /// The recorded store of the loaded trace's record (0-based).
    Recorded(u64),
    /// The client model's: chunks `from..` of lookup `seq`.
    Tail { seq: u64, from: usize },
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
pub struct ClientModel<'a> {
    shape: Shape,
    prompts: Window<'a>,
    /// vLLM stores still to come, by the first key the recorded store names: the lookup, and
    /// the chunks the recording's and the replay's hit prefixes ended at.
    pending: KeyMap<Pending>,
    /// A recorded store being replayed otherwise, until its `finish_write`.
    rewritten: Option<Rewritten>,
    pub report: ClientReport,
}

/// A recorded store the modelled client makes otherwise.
struct Rewritten {
    recorded: Vec<KeyId>,
    /// What the client stores instead (empty: nothing): chunks `from..` of lookup `seq`.
    wanted: Vec<KeyId>,
    seq: u64,
    from: usize,
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

impl<'a> ClientModel<'a> {
    /// The model of a replay of `loaded` (which it then reads its window of lookups from), or
    /// of a trace read as it comes.
    pub fn new(info: ClientInfo, loaded: Option<&'a Loaded>) -> ClientModel<'a> {
        let prompts = match loaded.and_then(|l| Some((l, l.lookup_index()?))) {
            Some((loaded, index)) => Window::Indexed {
                records: &loaded.records,
                index,
                next: 0,
            },
            None => Window::Own(Prompts::default()),
        };
        ClientModel {
            shape: info.model,
            prompts,
            pending: KeyMap::default(),
            rewritten: None,
            report: ClientReport {
                info,
                ..ClientReport::default()
            },
        }
    }

    /// A lookup was issued (by the loaded trace's record `record`, 0-based, when replaying
    /// one); returns its handle for [`ClientModel::retrieve_closed`].
    pub fn looked_up(&mut self, groups: &[PrefetchGroup], record: Option<u64>) -> u64 {
        self.prompts.add(groups, record)
    }

    /// What the end of a store session of `keys` touches: every chunk of the prompt up to the
    /// store's last, when the store is tied to a lookup; the store's own keys otherwise.
    /// `record` is the loaded trace's record (0-based) whose recorded keys these are; `None`
    /// when they are the client model's (the store [`ClientModel::rewrite`] last replaced) or
    /// the trace is read as it comes.
    pub fn store_touch(&mut self, keys: &[KeyId], record: Option<u64>) -> Vec<KeyId> {
        let origin = match (record, &self.rewritten) {
            (Some(record), _) => Some(Origin::Recorded(record)),
            (None, Some(r)) => Some(Origin::Tail {
                seq: r.seq,
                from: r.from,
            }),
            (None, None) => None,
        };
        self.prompts
            .locate(keys, origin)
            .and_then(|(seq, _, end)| Some(head(self.prompts.get(seq)?, end)))
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
        let n = first_group(prompt).len();
        let (recorded, replayed) = (recorded as usize, replayed as usize);
        if recorded < n {
            let first = first_group(prompt)[recorded];
            if self.pending.len() >= 2 * PROMPTS {
                // Stores that never came (an aborted request): forget those whose lookup
                // has left the window a store can be tied to.
                let oldest = self.prompts.front();
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
        let keys = tail(prompt, replayed);
        self.report.stores_added += 1;
        self.report.keys_added_by_new_stores += keys.len() as u64;
        Some(NewStore {
            prompt: head(prompt, n),
            object_bytes: prompt.first().map_or(0, |g| g.object_bytes),
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
                if replayed == recorded || tail(prompt, recorded) != *keys {
                    return Rewrite::Keep;
                }
                let wanted = tail(prompt, replayed);
                self.rewritten = Some(Rewritten {
                    recorded: keys.clone(),
                    wanted: wanted.clone(),
                    seq,
                    from: replayed,
                });
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
                let Some(Rewritten {
                    recorded, wanted, ..
                }) = &self.rewritten
                else {
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

    fn lookup(model: &mut ClientModel<'_>, n: u32) -> u64 {
        model.looked_up(
            &[PrefetchGroup {
                keys: keys(0..n),
                object_bytes: 4096,
                chunk_tokens: Some(64),
                window: -1,
            }],
            None,
        )
    }

    fn vllm() -> ClientModel<'static> {
        ClientModel::new(
            ClientInfo {
                model: Shape::Vllm,
                ..ClientInfo::default()
            },
            None,
        )
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
        let mut m = ClientModel::new(ClientInfo::default(), None);
        let seq = lookup(&mut m, 5);
        assert!(m.retrieve_closed(seq, 2, 0).is_none());
        assert!(matches!(m.rewrite(&reserve(keys(2..5))), Rewrite::Keep));
        // The session of a store of chunks 2..4 touches chunks 0..4 of its prompt.
        assert_eq!(m.store_touch(&keys(2..4), None), keys(0..4));
        // A store of keys no lookup named touches its own keys.
        let stray = keys(100..103);
        assert_eq!(m.store_touch(&stray, None), stray);
    }

    #[test]
    fn the_index_of_a_loaded_trace_ties_every_store_as_a_window_of_its_own_does() {
        // A trace of conversations behind one shared system prompt: each lookup names its
        // conversation's first n chunks (some in two groups, the second a sliding window's
        // shorter one), each store a tail of a recent lookup, of an old one or stray keys.
        // Enough lookups that stores outlive their lookup's place in the window. The window
        // kept as the lookups come is the reference: the index must answer as it does for
        // the recorded stores, for the client model's tails, and after a lookup the replay
        // did not make.
        let mut rng = kvtrace_io::rng::SplitMix64::new(7);
        let key = |conv: u64, chunk: u64| match chunk {
            0 | 1 => KeyId(u128::from(chunk) + 1),
            _ => KeyId((u128::from(conv) << 32) + u128::from(chunk) + 1_000),
        };
        let group = |keys: Vec<KeyId>| PrefetchGroup {
            keys,
            object_bytes: 4096,
            chunk_tokens: Some(64),
            window: -1,
        };
        let mut records = Vec::new();
        let mut lookups: Vec<Vec<KeyId>> = Vec::new();
        for _ in 0..6_000 {
            let call = if lookups.is_empty() || rng.next_f64() < 0.5 {
                let (conv, n) = (rng.range(0, 150), rng.range(1, 12));
                let keys: Vec<KeyId> = (0..n).map(|c| key(conv, c)).collect();
                let mut groups = vec![group(keys.clone())];
                if rng.next_f64() < 0.2 {
                    let short = rng.range(0, n) as usize;
                    groups.push(group(keys[..short].iter().map(|k| KeyId(!k.0)).collect()));
                }
                lookups.push(keys);
                Call::Prefetch {
                    groups,
                    prefix_only: true,
                    readers: 1,
                    lock: true,
                    skip_l2: false,
                    request_id: String::new(),
                }
            } else {
                let back = match rng.next_f64() {
                    x if x < 0.7 => rng.range(0, 3),
                    x if x < 0.9 => rng.range(1_000, 1_040),
                    _ => rng.range(0, 2_000),
                } as usize;
                let of = &lookups[lookups.len() - 1 - back.min(lookups.len() - 1)];
                let from = rng.range(0, of.len() as u64) as usize;
                let mut keys = of[from..].to_vec();
                if rng.next_f64() < 0.05 {
                    keys.push(key(rng.range(0, 150), rng.range(0, 12)));
                }
                reserve(keys)
            };
            records.push(LoadedRecord {
                offset: 0,
                t_mono: 0.0,
                qualname: std::sync::Arc::from(""),
                call: Ok(call),
            });
        }
        let index = LookupIndex::build(&records).unwrap();
        let mut own = Window::Own(Prompts::default());
        let mut indexed = Window::Indexed {
            records: &records,
            index: &index,
            next: 0,
        };
        let skipped = 2_500;
        let (mut stores, mut tails, mut tied) = (0, 0, 0);
        for (r, record) in records.iter().enumerate() {
            match record.call.as_ref().unwrap() {
                Call::Prefetch { groups, .. } => {
                    if r == skipped {
                        // The replay's server refused this lookup: neither window has it.
                        continue;
                    }
                    let seq = own.add(groups, Some(r as u64));
                    assert_eq!(indexed.add(groups, Some(r as u64)), seq, "record {r}");
                    // A client-model store of a tail of a lookup still remembered.
                    let back = rng.range(0, 1_100).min(seq);
                    let Some(prompt) = own.get(seq - back) else {
                        continue;
                    };
                    assert_eq!(indexed.get(seq - back), Some(prompt), "record {r}");
                    let from = rng.range(0, chunks(prompt) as u64) as usize;
                    let keys = tail(prompt, from);
                    let origin = Origin::Tail {
                        seq: seq - back,
                        from,
                    };
                    let expected = own.locate(&keys, None);
                    assert_eq!(indexed.locate(&keys, Some(origin)), expected, "record {r}");
                    tails += 1;
                    tied += usize::from(expected.is_some());
                }
                Call::ReserveWrite { keys, .. } => {
                    let expected = own.locate(keys, None);
                    let origin = Some(Origin::Recorded(r as u64));
                    assert_eq!(indexed.locate(keys, origin), expected, "record {r}");
                    stores += 1;
                    tied += usize::from(expected.is_some());
                }
                _ => unreachable!(),
            }
        }
        assert!(
            matches!(indexed, Window::Own(_)),
            "the skipped lookup left the index"
        );
        assert!(
            stores > 2_000 && tails > 2_000,
            "{stores} stores, {tails} tails"
        );
        assert!(tied > 2_000 && tied < stores + tails - 500, "{tied} tied");
    }

    #[test]
    fn a_store_is_tied_to_a_lookup_only_while_it_is_among_the_last_prompts() {
        let mut m = ClientModel::new(ClientInfo::default(), None);
        let group = |range| PrefetchGroup {
            keys: keys(range),
            object_bytes: 4096,
            chunk_tokens: Some(64),
            window: -1,
        };
        // Lookup i names chunks 10i..10i+10: every key belongs to one lookup.
        let lookups = PROMPTS as u32 + 3 * PROMPTS as u32 / 2;
        for i in 0..lookups {
            m.looked_up(&[group(10 * i..10 * i + 10)], None);
            // What the index holds stays within twice the keys of the lookups it remembers.
            let Window::Own(prompts) = &m.prompts else {
                panic!("a trace read as it comes keeps its own window");
            };
            assert!(
                prompts.at.len() <= 2 * prompts.held,
                "{} > 2 × {}",
                prompts.at.len(),
                prompts.held
            );
        }
        // The lookups that left the window no longer tie their stores: those touch their own
        // keys, while a store of the oldest lookup still remembered touches its prompt's head.
        let gone = lookups - PROMPTS as u32 - 1;
        let stale = keys(10 * gone + 4..10 * gone + 6);
        assert_eq!(m.store_touch(&stale, None), stale);
        let oldest = gone + 1;
        let kept = keys(10 * oldest + 4..10 * oldest + 6);
        assert_eq!(
            m.store_touch(&kept, None),
            keys(10 * oldest..10 * oldest + 6)
        );
        // Keys a later lookup names again belong to that lookup: a store of them touches its
        // head, one with a key only the earlier lookup named is tied to neither.
        let last = lookups - 1;
        m.looked_up(&[group(10 * last..10 * last + 4)], None);
        assert_eq!(
            m.store_touch(&keys(10 * last + 2..10 * last + 4), None),
            keys(10 * last..10 * last + 4)
        );
        let mixed = keys(10 * last + 2..10 * last + 5);
        assert_eq!(m.store_touch(&mixed, None), mixed);
    }
}
