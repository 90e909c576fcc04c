//! Splitting one storage trace between the ranks of a run, so that N replayers together
//! issue the recorded traffic against one shared tier.
//!
//! The unit is what a server handles as one piece: a retrieve session (a
//! `submit_prefetch_task` and the reads of its hit) or a store session (a `reserve_write`
//! and its `finish_write`). A session is never split, so each rank's calls stay the
//! sequences a server sees. Every rank reads the whole trace and keeps its own sessions;
//! the split depends on the trace and the world size only, never on timing.

use serde::Serialize;

use super::dispatch::Call;
use crate::storage::KeyId;

/// How a trace is split between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShardMode {
    /// Requests dealt out in turn: the i-th request (a prefetch and everything up to the
    /// next one, its store included) goes to rank i mod N. Ranks get equal shares; requests
    /// sharing a prefix land on different ranks, so their hits cross ranks.
    ByRequest,
    /// Sessions by the hash of their first key, as a prefix-affinity router places
    /// requests: a retrieve and the store of the same prompt, and every request sharing
    /// its first chunk, go to the same rank.
    ByKey,
    /// Every rank replays the whole trace (N clients of the same workload).
    Replicate,
}

impl ShardMode {
    pub fn name(self) -> &'static str {
        match self {
            ShardMode::ByRequest => "by-request",
            ShardMode::ByKey => "by-key",
            ShardMode::Replicate => "replicate",
        }
    }
}

/// One rank's view of the split, fed every call of the trace in order.
#[derive(Clone, Debug)]
pub struct Sharder {
    mode: ShardMode,
    rank: u64,
    world_size: u64,
    requests: u64,
    /// Whether the open retrieve session, and the open store session, are this rank's.
    retrieve_ours: bool,
    store_ours: bool,
}

/// The rank that owns `key` among `world_size` (its hash is already uniform).
fn owner(key: KeyId, world_size: u64) -> u64 {
    ((key.0 as u64) ^ ((key.0 >> 64) as u64)) % world_size
}

impl Sharder {
    pub fn new(mode: ShardMode, rank: u32, world_size: u32) -> Sharder {
        let (rank, world_size) = (u64::from(rank), u64::from(world_size.max(1)));
        Sharder {
            mode,
            rank,
            world_size,
            requests: 0,
            // Calls before the first session opens (a trace cut mid-request) are rank 0's.
            retrieve_ours: rank == 0,
            store_ours: rank == 0,
        }
    }

    /// Whether this rank counts a record that is not a call it replays (an unknown
    /// qualname, a level it skips): rank 0 does, so the run counts each once.
    pub fn owns_undecoded(&self) -> bool {
        self.mode == ShardMode::Replicate || self.rank == 0
    }

    /// Whether this rank replays `call`.
    pub fn owns(&mut self, call: &Call) -> bool {
        let first_key = || call.keys().next();
        match (self.mode, call) {
            (ShardMode::Replicate, _) => true,
            (ShardMode::ByRequest, Call::Prefetch { .. }) => {
                let ours = self.requests % self.world_size == self.rank;
                self.requests += 1;
                self.retrieve_ours = ours;
                self.store_ours = ours;
                ours
            }
            (ShardMode::ByKey, Call::Prefetch { .. }) => {
                self.retrieve_ours =
                    first_key().map_or(self.rank == 0, |k| owner(k, self.world_size) == self.rank);
                self.retrieve_ours
            }
            (ShardMode::ByKey, Call::ReserveWrite { .. }) => {
                self.store_ours =
                    first_key().map_or(self.rank == 0, |k| owner(k, self.world_size) == self.rank);
                self.store_ours
            }
            (_, Call::ReserveWrite { .. } | Call::FinishWrite { .. }) => self.store_ours,
            (_, Call::ReadEnter { .. } | Call::ReadExit { .. } | Call::FinishRead { .. }) => {
                self.retrieve_ours
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::PrefetchGroup;

    fn prefetch(first: u128) -> Call {
        Call::Prefetch {
            groups: vec![PrefetchGroup {
                keys: vec![KeyId(first), KeyId(first + 1)],
                ..PrefetchGroup::default()
            }],
            prefix_only: true,
            readers: 1,
            lock: true,
            skip_l2: false,
            request_id: String::new(),
        }
    }

    /// A request: lookup, read, store.
    fn request(first: u128) -> Vec<Call> {
        let keys = vec![KeyId(first), KeyId(first + 1)];
        vec![
            prefetch(first),
            Call::ReadEnter { keys: keys.clone() },
            Call::FinishRead {
                keys: keys.clone(),
                read_locks: 1,
            },
            Call::ReserveWrite {
                keys: keys.clone(),
                object_bytes: 1,
            },
            Call::FinishWrite { keys },
        ]
    }

    fn trace() -> Vec<Call> {
        (0..40u128)
            .flat_map(|i| request((i % 7) << 70 | i))
            .collect()
    }

    /// Which rank took each call, for a world of `n`.
    fn split(mode: ShardMode, n: u32) -> Vec<Vec<usize>> {
        let calls = trace();
        (0..n)
            .map(|r| {
                let mut s = Sharder::new(mode, r, n);
                (0..calls.len()).filter(|&i| s.owns(&calls[i])).collect()
            })
            .collect()
    }

    #[test]
    fn every_call_goes_to_exactly_one_rank_and_sessions_stay_whole() {
        for mode in [ShardMode::ByRequest, ShardMode::ByKey] {
            let parts = split(mode, 3);
            let mut all: Vec<usize> = parts.concat();
            all.sort_unstable();
            assert_eq!(all, (0..200).collect::<Vec<_>>(), "{mode:?}");
            for part in &parts {
                // Requests are five calls: a rank takes whole requests.
                for chunk in part.chunks(5) {
                    assert_eq!(chunk[0] % 5, 0, "{mode:?}: {part:?}");
                    assert_eq!(chunk[4], chunk[0] + 4, "{mode:?}");
                }
            }
        }
    }

    #[test]
    fn by_request_deals_in_turn_and_replicate_gives_all() {
        let parts = split(ShardMode::ByRequest, 4);
        assert!(parts.iter().all(|p| p.len() == 50));
        assert_eq!(parts[1][0], 5);
        assert!(split(ShardMode::Replicate, 3)
            .iter()
            .all(|p| p.len() == 200));
    }

    #[test]
    fn by_key_keeps_a_prefix_on_one_rank() {
        let calls = trace();
        for r in 0..3 {
            let mut s = Sharder::new(ShardMode::ByKey, r, 3);
            for c in &calls {
                let ours = s.owns(c);
                if let Call::Prefetch { groups, .. } = c {
                    assert_eq!(ours, owner(groups[0].keys[0], 3) == u64::from(r));
                }
            }
        }
    }
}
