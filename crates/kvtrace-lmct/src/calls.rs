//! The six traced StorageManager calls (format spec §7) and their arguments in LMCache
//! 0.5.6's shape, so that anything kvtrace records reads as a 0.5.6 storage trace.

use super::codec::{MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec};
use super::msgpack;

/// Qualname prefix of every StorageManager call.
pub const SM: &str = "lmcache.v1.distributed.storage_manager.StorageManager";
pub const RESERVE_WRITE: &str =
    "lmcache.v1.distributed.storage_manager.StorageManager.reserve_write";
pub const FINISH_WRITE: &str = "lmcache.v1.distributed.storage_manager.StorageManager.finish_write";
pub const SUBMIT_PREFETCH_TASK: &str =
    "lmcache.v1.distributed.storage_manager.StorageManager.submit_prefetch_task";
pub const READ_PREFETCHED_ENTER: &str =
    "lmcache.v1.distributed.storage_manager.StorageManager.read_prefetched_results.__enter__";
pub const READ_PREFETCHED_EXIT: &str =
    "lmcache.v1.distributed.storage_manager.StorageManager.read_prefetched_results.__exit__";
pub const FINISH_READ_PREFETCHED: &str =
    "lmcache.v1.distributed.storage_manager.StorageManager.finish_read_prefetched";

/// kvtrace's trailer record (an extension; LMCache's replay skips unknown qualnames).
pub const RECORDER_SUMMARY: &str = "kvtrace.recorder.summary";

/// The `level_meta` key by which kvtrace's recorder promises, in the header, that the file
/// ends with a [`RECORDER_SUMMARY`] record: a file cut short at a frame boundary would
/// otherwise read as complete.
pub const RECORDER_META: &str = "kvtrace_recorder";

/// The part after the StorageManager prefix, with the context-manager suffixes shortened
/// as LMCache's replay table shows them (`read_prefetched_results.enter`).
pub fn short_name(qualname: &str) -> String {
    let short = qualname
        .strip_prefix(SM)
        .and_then(|s| s.strip_prefix('.'))
        .unwrap_or(qualname);
    short
        .replace(".__enter__", ".enter")
        .replace(".__exit__", ".exit")
}

/// One traced call with borrowed arguments.
#[derive(Clone, Copy, Debug)]
pub enum StorageCall<'a> {
    ReserveWrite {
        keys: &'a [ObjectKey],
        layout_desc: &'a MemoryLayoutDesc,
    },
    FinishWrite {
        keys: &'a [ObjectKey],
    },
    SubmitPrefetchTask {
        spec: &'a PrefetchTaskSpec,
        external_request_id: &'a str,
        skip_l2: bool,
    },
    ReadPrefetchedEnter {
        keys: &'a [ObjectKey],
    },
    ReadPrefetchedExit {
        keys: &'a [ObjectKey],
    },
    FinishReadPrefetched {
        keys: &'a [ObjectKey],
        read_locks: i64,
    },
}

fn put_keys(out: &mut Vec<u8>, keys: &[ObjectKey]) {
    msgpack::put_str(out, "keys");
    msgpack::put_array_len(out, keys.len());
    for k in keys {
        k.encode(out);
    }
}

impl<'a> StorageCall<'a> {
    /// How a server reads prefetched objects: the `read_prefetched_results` context
    /// (enter, exit) and the release of one read lock per key.
    pub fn read_prefetched(keys: &'a [ObjectKey]) -> [StorageCall<'a>; 3] {
        [
            StorageCall::ReadPrefetchedEnter { keys },
            StorageCall::ReadPrefetchedExit { keys },
            StorageCall::FinishReadPrefetched {
                keys,
                read_locks: 1,
            },
        ]
    }
}

impl StorageCall<'_> {
    pub fn qualname(&self) -> &'static str {
        match self {
            StorageCall::ReserveWrite { .. } => RESERVE_WRITE,
            StorageCall::FinishWrite { .. } => FINISH_WRITE,
            StorageCall::SubmitPrefetchTask { .. } => SUBMIT_PREFETCH_TASK,
            StorageCall::ReadPrefetchedEnter { .. } => READ_PREFETCHED_ENTER,
            StorageCall::ReadPrefetchedExit { .. } => READ_PREFETCHED_EXIT,
            StorageCall::FinishReadPrefetched { .. } => FINISH_READ_PREFETCHED,
        }
    }

    /// Appends the `args` map exactly as LMCache 0.5.6 records it (defaults materialised).
    pub fn encode_args(&self, out: &mut Vec<u8>) {
        match self {
            StorageCall::ReserveWrite { keys, layout_desc } => {
                msgpack::put_map_len(out, 2);
                put_keys(out, keys);
                msgpack::put_str(out, "layout_desc");
                layout_desc.encode(out);
            }
            StorageCall::FinishWrite { keys }
            | StorageCall::ReadPrefetchedEnter { keys }
            | StorageCall::ReadPrefetchedExit { keys } => {
                msgpack::put_map_len(out, 1);
                put_keys(out, keys);
            }
            StorageCall::SubmitPrefetchTask {
                spec,
                external_request_id,
                skip_l2,
            } => {
                msgpack::put_map_len(out, 3);
                msgpack::put_str(out, "spec");
                spec.encode(out);
                msgpack::put_str(out, "external_request_id");
                msgpack::put_str(out, external_request_id);
                msgpack::put_str(out, "skip_l2");
                msgpack::put_bool(out, *skip_l2);
            }
            StorageCall::FinishReadPrefetched { keys, read_locks } => {
                msgpack::put_map_len(out, 2);
                put_keys(out, keys);
                msgpack::put_str(out, "read_locks");
                msgpack::put_int(out, *read_locks);
            }
        }
    }
}
