//! The benchmark's traffic as StorageManager calls. Every entry has an LMCache object key
//! (its name hashed, the model's name), and with `--record` every write and read is
//! published on the event bus as the calls an LMCache server makes for it — a write as
//! `reserve_write` then `finish_write`, a read as `submit_prefetch_task` then, on a hit,
//! `read_prefetched_results` and `finish_read_prefetched` — so `kvtrace replay` can re-run
//! the run's traffic against any tier configuration.

use std::sync::Arc;

use kvtrace_cache::bus::Tracer;
use kvtrace_cache::storage::KeyId;
use kvtrace_io::rng::hash32;
use kvtrace_lmct::calls::StorageCall;
use kvtrace_lmct::codec::{LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec};
use kvtrace_otel::SpanSink;

pub struct CallTrace {
    tracer: Tracer,
    model_name: String,
    /// Bytes one token of one tensor-parallel rank's share takes.
    rank_bytes_per_token: u64,
    /// Where each served request goes as a span tree (see [`super::spans`]).
    spans: Option<Arc<dyn SpanSink>>,
}

impl CallTrace {
    pub fn new(tracer: Tracer, model_name: &str, rank_bytes_per_token: u64) -> CallTrace {
        CallTrace {
            tracer,
            model_name: model_name.into(),
            rank_bytes_per_token: rank_bytes_per_token.max(1),
            spans: None,
        }
    }

    /// Sends each served request to `sink` as a span tree.
    pub fn with_spans(mut self, sink: Option<Arc<dyn SpanSink>>) -> CallTrace {
        self.spans = sink;
        self
    }

    pub fn spans(&self) -> Option<&Arc<dyn SpanSink>> {
        self.spans.as_ref()
    }

    /// Tokens of an entry of `bytes` bytes.
    pub fn tokens(&self, bytes: u64) -> u64 {
        bytes / self.rank_bytes_per_token
    }

    /// An entry's object key, from its name only.
    pub fn object_key(&self, name: &str) -> ObjectKey {
        ObjectKey {
            chunk_hash: hash32(&[xxhash_rust::xxh3::xxh3_64(name.as_bytes())]).to_vec(),
            model_name: self.model_name.clone(),
            kv_rank: 0,
            object_group_id: 0,
            cache_salt: String::new(),
        }
    }

    pub fn key_id(&self, name: &str) -> KeyId {
        KeyId::of(&self.object_key(name))
    }

    /// Bytes of an entry of `tokens` tokens.
    pub fn entry_bytes(&self, tokens: u64) -> u64 {
        tokens * self.rank_bytes_per_token
    }

    /// A whole entry as one object: `tokens` rows of the rank's bytes per token.
    fn layout(&self, tokens: u64) -> MemoryLayoutDesc {
        MemoryLayoutDesc {
            shapes: vec![vec![1, 1, tokens as i64, self.rank_bytes_per_token as i64]],
            dtypes: vec!["torch.uint8".into()],
        }
    }

    fn publish(&self, call: StorageCall<'_>) {
        self.tracer
            .publish_call(call.qualname(), |buf| call.encode_args(buf));
    }

    /// A write of a new entry; `stored` says whether it was written (not already cached).
    pub fn write(&self, name: &str, tokens: u64, stored: bool) {
        if !self.tracer.is_recording() {
            return;
        }
        let keys = [self.object_key(name)];
        let layout = self.layout(tokens);
        self.publish(StorageCall::ReserveWrite {
            keys: &keys,
            layout_desc: &layout,
        });
        if stored {
            self.publish(StorageCall::FinishWrite { keys: &keys });
        }
    }

    /// A lookup and, on a hit of `size` bytes, the read.
    pub fn read(&self, name: &str, request_id: &str, hit: Option<u64>) {
        if !self.tracer.is_recording() {
            return;
        }
        let key = self.object_key(name);
        let tokens = hit.map_or(0, |size| size / self.rank_bytes_per_token);
        let spec = PrefetchTaskSpec::single_group(
            vec![key.clone()],
            self.layout(tokens),
            "prefix",
            LockMode::Lock,
        );
        self.publish(StorageCall::SubmitPrefetchTask {
            spec: &spec,
            external_request_id: request_id,
            skip_l2: false,
        });
        if hit.is_some() {
            let keys = [key];
            for call in StorageCall::read_prefetched(&keys) {
                self.publish(call);
            }
        }
    }
}
