//! The traced facade over a [`StorageManager`]: LMCache's six StorageManager calls with
//! LMCache's arguments (object keys, memory layouts, prefetch task specs). Each call is
//! published on the event bus in LMCache's argument shape — so code driving a manager
//! through this facade records LMCT as an LMCache server does — and then applied to the
//! manager by key id.
//!
//! The manager itself publishes nothing: callers that already hold the recorded argument
//! bytes (replay) publish those and drive the manager directly, and one set of semantics
//! serves both.

use crate::bus::Tracer;
use kvtrace_lmct::calls::StorageCall;
use kvtrace_lmct::codec::{LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec};

use super::manager::{PrefetchGroup, PrefetchRequest, StorageManager};
use super::{CallError, KeyId, PrefetchOutcome, Reservation};

/// A manager and the tracer its calls are published on.
pub struct Traced {
    manager: StorageManager,
    tracer: Tracer,
}

fn ids(keys: &[ObjectKey]) -> Vec<KeyId> {
    keys.iter().map(KeyId::of).collect()
}

impl Traced {
    pub fn new(manager: StorageManager, tracer: Tracer) -> Traced {
        Traced { manager, tracer }
    }

    /// The manager, for what LMCache does not trace (the clock, statistics, `delete`).
    pub fn manager(&self) -> &StorageManager {
        &self.manager
    }

    pub fn manager_mut(&mut self) -> &mut StorageManager {
        &mut self.manager
    }

    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    pub fn into_manager(self) -> StorageManager {
        self.manager
    }

    fn publish(&self, call: StorageCall<'_>) {
        self.tracer
            .publish_call(call.qualname(), |buf| call.encode_args(buf));
    }

    /// `reserve_write`: see [`StorageManager::reserve_write`].
    pub fn reserve_write(&mut self, keys: &[ObjectKey], layout: &MemoryLayoutDesc) -> Reservation {
        self.publish(StorageCall::ReserveWrite {
            keys,
            layout_desc: layout,
        });
        self.manager
            .reserve_write(&ids(keys), layout.object_bytes().unwrap_or(0))
    }

    /// `finish_write`: see [`StorageManager::finish_write`].
    pub fn finish_write(&mut self, keys: &[ObjectKey]) -> Result<Vec<KeyId>, CallError> {
        self.publish(StorageCall::FinishWrite { keys });
        self.manager.finish_write(&ids(keys))
    }

    /// `submit_prefetch_task`: see [`StorageManager::submit_prefetch`]. The spec's
    /// `fetching_policy` other than `full` is LMCache's default, `prefix`.
    pub fn submit_prefetch_task(
        &mut self,
        spec: &PrefetchTaskSpec,
        external_request_id: &str,
        skip_l2: bool,
    ) -> Result<PrefetchOutcome, CallError> {
        self.publish(StorageCall::SubmitPrefetchTask {
            spec,
            external_request_id,
            skip_l2,
        });
        let groups: Vec<PrefetchGroup> = spec
            .key_groups
            .iter()
            .map(|g| PrefetchGroup {
                keys: ids(&g.keys),
                object_bytes: g.layout_desc.object_bytes().unwrap_or(0),
                chunk_tokens: g.layout_desc.chunk_tokens(),
                window: g.sliding_window_size,
            })
            .collect();
        let request = PrefetchRequest {
            groups: &groups,
            prefix_only: spec.fetching_policy != "full",
            readers: spec.num_kv_readers.max(0) as u64,
            lock: spec.lock_mode == LockMode::Lock,
            skip_l2,
        };
        self.manager.submit_prefetch(&request, external_request_id)
    }

    /// The entry of `read_prefetched_results`: see [`StorageManager::read_prefetched_enter`].
    pub fn read_prefetched_enter(&mut self, keys: &[ObjectKey]) -> Result<(), CallError> {
        self.publish(StorageCall::ReadPrefetchedEnter { keys });
        self.manager.read_prefetched_enter(&ids(keys))
    }

    /// The exit of `read_prefetched_results`: see [`StorageManager::read_prefetched_exit`].
    pub fn read_prefetched_exit(&mut self, keys: &[ObjectKey], entered: bool) {
        self.publish(StorageCall::ReadPrefetchedExit { keys });
        self.manager.read_prefetched_exit(&ids(keys), entered);
    }

    /// `finish_read_prefetched`: see [`StorageManager::finish_read_prefetched`].
    pub fn finish_read_prefetched(&mut self, keys: &[ObjectKey], read_locks: i64) {
        self.publish(StorageCall::FinishReadPrefetched { keys, read_locks });
        self.manager.finish_read_prefetched(&ids(keys), read_locks);
    }
}
