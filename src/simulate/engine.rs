//! The mock engine: one `pass` schedules the running requests first, then admits waiting
//! ones against the pass's budget ([`Budget`]) and the KV pool, and takes as long as the
//! timing model says its prefill chunks and decode step take. Every token of a pass is
//! emitted at the pass's end. vLLM is the base; TRT-LLM admits only what fits to
//! completion and never preempts; SGLang budgets prefill and memory its own way, may order
//! its queue by longest cached prefix, retracts under memory pressure (resetting its
//! new-token ratio) and times decode over unrounded sequence lengths.

use std::collections::VecDeque;
use std::sync::Arc;

use super::args::{EngineArgs, EngineType, Preemption, SglangPolicy};
use super::blocks::{BlockPool, KvEvent};
use super::budget::{Budget, NewTokenRatio};
use super::perf;

/// Index of a request in the simulation's request table.
pub type RequestId = u32;

/// A request as an engine sees it.
pub struct Sequence {
    pub id: RequestId,
    pub prompt_len: u32,
    pub output_len: u32,
    /// Chained hashes of the prompt's full blocks at this engine's block size.
    pub hashes: Arc<[u64]>,
    /// Tokens already generated; prefill-only workers generate one hidden token.
    pub generated: u32,
    computed: u32,
    blocks: Vec<u32>,
    registered: usize,
    /// Got tokens in the current pass.
    scheduled: bool,
    /// Its prompt's KV went to the external store (once, even if preempted later).
    stored: bool,
    /// Its prompt's KV arrives computed (a decode worker's handoff): admission costs no
    /// prefill. Cleared by preemption, after which the prompt is recomputed here.
    prefilled: bool,
}

impl Sequence {
    pub fn new(id: RequestId, prompt_len: u32, output_len: u32, hashes: Arc<[u64]>) -> Self {
        Sequence {
            id,
            prompt_len,
            output_len: output_len.max(1),
            hashes,
            generated: 0,
            computed: 0,
            blocks: Vec::new(),
            registered: 0,
            scheduled: false,
            stored: false,
            prefilled: false,
        }
    }

    /// A request whose prompt KV was computed elsewhere and transferred here.
    pub fn prefilled(id: RequestId, prompt_len: u32, output_len: u32, hashes: Arc<[u64]>) -> Self {
        Sequence {
            prefilled: true,
            ..Sequence::new(id, prompt_len, output_len, hashes)
        }
    }

    fn len(&self) -> u32 {
        self.prompt_len + self.generated
    }
}

/// An external KV store the engine consults, as an LMCache connector serves vLLM: a lookup
/// when a request is admitted, a load of the part its own cache lacks, a store once the
/// prompt's KV is computed.
pub trait KvConnector {
    /// Prompt tokens, from the start, that the store holds (pinned until [`KvConnector::load`]).
    fn lookup(&mut self, id: RequestId) -> u32;
    /// Loads prompt tokens `[from, from + tokens)` of what the lookup found (`tokens` may be
    /// 0) and releases the pins; returns the milliseconds the load adds to the pass.
    fn load(&mut self, id: RequestId, from: u32, tokens: u32) -> f64;
    /// The prompt's KV is computed: store what the store lacks.
    fn store(&mut self, id: RequestId);
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassOutput {
    pub duration_ms: f64,
    /// Requests admitted this pass with the prompt tokens their prefix hit covered.
    pub admitted: Vec<(RequestId, u32)>,
    /// Requests that emitted a token, and whether it was their last.
    pub emitted: Vec<(RequestId, bool)>,
    /// Requests that can never fit this engine.
    pub rejected: Vec<RequestId>,
    pub preempted: Vec<RequestId>,
    pub kv_events: Vec<KvEvent>,
}

pub struct Engine {
    args: EngineArgs,
    pool: BlockPool,
    running: Vec<Sequence>,
    waiting: VecDeque<Sequence>,
    /// Prefill-only engines (disaggregation) charge no decode step.
    prefill_only: bool,
    new_token_ratio: NewTokenRatio,
}

impl Engine {
    pub fn new(args: EngineArgs, track_events: bool, prefill_only: bool) -> Engine {
        Engine {
            new_token_ratio: NewTokenRatio::new(args.sglang.schedule_conservativeness),
            pool: BlockPool::new(
                args.num_gpu_blocks,
                args.enable_prefix_caching,
                track_events,
            ),
            args,
            running: Vec::new(),
            waiting: VecDeque::new(),
            prefill_only,
        }
    }

    pub fn enqueue(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn block_size(&self) -> u32 {
        self.args.block_size
    }

    /// Blocks a prompt would find cached here (the prefix a router could credit).
    pub fn cached_prefix_blocks(&self, hashes: &[u64]) -> usize {
        self.pool.match_prefix(hashes).0
    }

    fn blocks_for(&self, tokens: u32) -> usize {
        tokens.div_ceil(self.args.block_size) as usize
    }

    /// Runs one pass; `None` when there is nothing to do. With a connector, admissions
    /// load what the external store holds beyond the GPU prefix hit, and completed prompts
    /// are stored.
    pub fn pass(&mut self, mut connector: Option<&mut dyn KvConnector>) -> Option<PassOutput> {
        let mut out = PassOutput::default();
        let sglang = self.args.engine_type == EngineType::Sglang;
        let mut budget = if sglang {
            self.sglang_budget()
        } else {
            Budget::Tokens(self.args.max_num_batched_tokens.unwrap_or(u64::MAX))
        };
        let mut prefill = (0u64, 0u64, 0u64);
        for seq in &mut self.running {
            seq.scheduled = false;
        }
        let mut i = 0;
        while i < self.running.len() && !budget.exhausted() {
            let seq = &self.running[i];
            let before = seq.computed;
            let in_prefill = before < seq.prompt_len;
            let take = budget.take(seq.len() - before, in_prefill);
            if take == 0 {
                i += 1;
                continue;
            }
            let need = self
                .blocks_for(before + take)
                .saturating_sub(seq.blocks.len());
            if !self.grow(i, need, &mut out) {
                // Preempted itself; `i` now names the next request.
                continue;
            }
            let seq = &mut self.running[i];
            seq.computed += take;
            budget.spend(take, in_prefill, None);
            if before < seq.prompt_len || before + 1 < seq.len() {
                prefill.0 += 1;
                prefill.1 += u64::from(seq.computed);
                prefill.2 += u64::from(before);
            }
            seq.scheduled = true;
            i += 1;
        }
        let mut load_ms = 0.0;
        if out.preempted.is_empty() {
            load_ms = self.admit(&mut budget, &mut prefill, &mut out, &mut connector);
        }
        for seq in &mut self.running {
            if !seq.stored && seq.computed >= seq.prompt_len {
                seq.stored = true;
                if let Some(c) = connector.as_deref_mut() {
                    c.store(seq.id);
                }
            }
            let full = (seq.computed.min(seq.prompt_len) / self.args.block_size) as usize;
            while seq.registered < full.min(seq.hashes.len()) {
                self.pool
                    .register(seq.blocks[seq.registered], seq.hashes[seq.registered]);
                seq.registered += 1;
            }
        }
        let ready = self
            .running
            .iter()
            .filter(|s| s.scheduled && s.computed == s.len())
            .count() as u64;
        if prefill.0 == 0 && ready == 0 && out.rejected.is_empty() && out.preempted.is_empty() {
            return None;
        }
        let prefill_ms = if prefill.0 > 0 {
            perf::prefill_ms(prefill.0, prefill.1 / prefill.0, prefill.2 / prefill.0)
        } else {
            0.0
        };
        let block = u64::from(self.args.block_size);
        let decode_ms = if self.prefill_only {
            0.0
        } else if sglang {
            let tokens: u64 = self.running.iter().map(|s| u64::from(s.len())).sum();
            perf::decode_ms(ready, tokens, self.pool.capacity() * block)
        } else {
            perf::decode_ms(
                ready,
                self.pool.active() * block,
                self.pool.capacity() * block,
            )
        };
        self.new_token_ratio.decay();
        let speedup = self.args.speedup_ratio;
        out.duration_ms = load_ms
            + perf::scaled(prefill_ms, speedup)
            + perf::scaled(
                perf::scaled(decode_ms, speedup),
                self.args.decode_speedup_ratio,
            );
        self.emit(&mut out);
        out.kv_events = self.pool.take_events();
        Some(out)
    }

    /// SGLang's budget for this pass: the chunk budget, and the free and evictable KV
    /// tokens minus the output running requests are still expected to generate.
    fn sglang_budget(&self) -> Budget {
        let s = &self.args.sglang;
        let page = self.args.block_size;
        let ratio = self.new_token_ratio.value();
        let reserved: f64 = self
            .running
            .iter()
            .map(|q| {
                u64::from(q.output_len - q.generated).min(s.clip_max_new_tokens) as f64 * ratio
            })
            .sum();
        let free = (self.pool.capacity() - self.pool.active()) * u64::from(page);
        Budget::sglang(s, page, free, reserved)
    }

    /// SGLang's `lpm` policy serves the longest cached prefix first, while at most 128
    /// requests wait (FIFO beyond, where sorting costs more than it gains).
    fn order_waiting(&mut self) {
        let lpm = self.args.engine_type == EngineType::Sglang
            && self.args.sglang.schedule_policy == SglangPolicy::Lpm;
        if !lpm || self.waiting.len() > 128 || self.waiting.len() < 2 {
            return;
        }
        let pool = &self.pool;
        self.waiting
            .make_contiguous()
            .sort_by_key(|s| std::cmp::Reverse(pool.match_prefix(&s.hashes).0));
    }

    /// Allocates `need` blocks for running request `i`, preempting others (or itself) when
    /// the pool is full. `false` when `i` itself was preempted. TRT-LLM never preempts: it
    /// admitted only what fits to completion.
    fn grow(&mut self, i: usize, need: usize, out: &mut PassOutput) -> bool {
        let mut i = i;
        for _ in 0..need {
            loop {
                if let Some(b) = self.pool.allocate() {
                    self.running[i].blocks.push(b);
                    break;
                }
                if self.args.engine_type == EngineType::Trtllm {
                    return false;
                }
                self.new_token_ratio.reset();
                let victim = match self.args.preemption {
                    Preemption::Lifo => self.running.len() - 1,
                    Preemption::Fifo => 0,
                };
                let mut seq = self.running.remove(victim);
                self.pool.release(&seq.blocks);
                seq.blocks.clear();
                seq.computed = 0;
                seq.registered = 0;
                seq.prefilled = false;
                out.preempted.push(seq.id);
                self.waiting.push_front(seq);
                if victim == i {
                    return false;
                }
                if victim < i {
                    i -= 1;
                }
            }
        }
        true
    }

    /// Admits waiting requests in order while the budget, the sequence limit and the pool
    /// allow; the first that does not fit blocks the ones behind it. Returns the time spent
    /// loading from the connector.
    fn admit(
        &mut self,
        budget: &mut Budget,
        prefill: &mut (u64, u64, u64),
        out: &mut PassOutput,
        connector: &mut Option<&mut dyn KvConnector>,
    ) -> f64 {
        let block = self.args.block_size;
        let mut load_ms = 0.0;
        self.order_waiting();
        while !budget.exhausted() {
            if self
                .args
                .max_num_seqs
                .is_some_and(|m| self.running.len() as u64 >= m)
            {
                break;
            }
            let Some(seq) = self.waiting.front() else {
                break;
            };
            let len = seq.len();
            let total = self.blocks_for(len) as u64;
            let no_evict = self.args.engine_type == EngineType::Trtllm;
            // TRT-LLM admits only what fits to completion: a request whose whole output
            // cannot fit would wait forever.
            let needed = if no_evict {
                self.blocks_for(seq.prompt_len.saturating_add(seq.output_len)) as u64
            } else {
                total
            };
            if needed > self.pool.capacity()
                || self
                    .args
                    .max_model_len
                    .is_some_and(|m| u64::from(seq.prompt_len) >= m)
            {
                let seq = self.waiting.pop_front().expect("front");
                out.rejected.push(seq.id);
                continue;
            }
            let (mut hit, mut active_hit) = self.pool.match_prefix(&seq.hashes);
            let mut cached = hit as u32 * block;
            if cached >= len {
                cached = (len - 1) / block * block;
                hit = (cached / block) as usize;
                active_hit = self.pool.match_prefix(&seq.hashes[..hit]).1;
            }
            let free = self.pool.capacity() - self.pool.active();
            let fits = if no_evict {
                let footprint = |s: &Sequence| s.prompt_len.saturating_add(s.output_len);
                let reserved: u64 = self
                    .running
                    .iter()
                    .map(|s| self.blocks_for(footprint(s)).saturating_sub(s.blocks.len()) as u64)
                    .sum();
                let own = self.blocks_for(footprint(seq)) as u64 - active_hit;
                own + reserved <= free
            } else {
                total - active_hit <= free
            };
            if !fits {
                break;
            }
            let (id, prefilled) = (seq.id, seq.prefilled);
            // A transferred prompt is all there; otherwise the store may extend the GPU hit,
            // and the last prompt token is always computed.
            let external = match connector.as_deref_mut() {
                _ if prefilled => len - cached,
                Some(c) => c.lookup(id).min(len - 1).saturating_sub(cached),
                None => 0,
            };
            let remaining = len - cached - external;
            let take = budget.take(remaining, !prefilled);
            let output_left = seq.output_len - seq.generated;
            let refused = !budget.admits(take, take == remaining, output_left)
                || (take == 0 && remaining > 0);
            if refused || (!self.args.enable_chunked_prefill && take < remaining) {
                if let Some(c) = connector.as_deref_mut() {
                    c.load(id, cached, 0);
                }
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front");
            for h in &seq.hashes[..hit] {
                seq.blocks.push(self.pool.acquire(*h));
            }
            seq.registered = hit;
            let mut grown = true;
            for _ in hit..self.blocks_for(cached + external + take) {
                match self.pool.allocate() {
                    Some(b) => seq.blocks.push(b),
                    None => grown = false,
                }
            }
            if let Some(c) = connector.as_deref_mut() {
                load_ms += c.load(id, cached, if grown { external } else { 0 });
            }
            if !grown {
                self.pool.release(&seq.blocks);
                seq.blocks.clear();
                seq.registered = 0;
                self.waiting.push_front(seq);
                break;
            }
            out.admitted.push((seq.id, cached.min(seq.prompt_len)));
            seq.computed = cached + external + take;
            budget.spend(take, !prefilled, Some((take == remaining, output_left)));
            if !prefilled {
                prefill.0 += 1;
                prefill.1 += u64::from(seq.computed);
                prefill.2 += u64::from(cached + external);
            }
            seq.scheduled = true;
            self.running.push(seq);
        }
        load_ms
    }

    /// Every scheduled request whose tokens are all computed emits one; finished ones
    /// release their blocks.
    fn emit(&mut self, out: &mut PassOutput) {
        let pool = &mut self.pool;
        self.running.retain_mut(|seq| {
            if !seq.scheduled || seq.computed != seq.len() {
                return true;
            }
            seq.generated += 1;
            let done = seq.generated >= seq.output_len;
            out.emitted.push((seq.id, done));
            if done {
                pool.release(&seq.blocks);
            }
            !done
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(id: RequestId, prompt: u32, output: u32) -> Sequence {
        Sequence::new(id, prompt, output, Arc::from(Vec::new()))
    }

    /// Runs passes until idle; returns each request's token count.
    fn drain(engine: &mut Engine, requests: usize) -> (Vec<u32>, Vec<RequestId>) {
        let (mut tokens, mut rejected) = (vec![0; requests], Vec::new());
        while let Some(out) = engine.pass(None) {
            for (id, _) in out.emitted {
                tokens[id as usize] += 1;
            }
            rejected.extend(out.rejected);
        }
        (tokens, rejected)
    }

    #[test]
    fn trtllm_rejects_what_cannot_fit_to_completion_and_never_preempts() {
        let args = EngineArgs {
            engine_type: EngineType::Trtllm,
            block_size: 32,
            num_gpu_blocks: 64,
            ..EngineArgs::default()
        };
        let mut engine = Engine::new(args, false, false);
        engine.enqueue(seq(0, 1000, 3000));
        engine.enqueue(seq(1, 100, 5));
        let (tokens, rejected) = drain(&mut engine, 2);
        assert_eq!(rejected, [0]);
        assert_eq!(tokens, [0, 5]);
    }

    #[test]
    fn a_full_pool_preempts_the_newest_and_everyone_still_finishes() {
        let args = EngineArgs {
            block_size: 16,
            num_gpu_blocks: 12,
            ..EngineArgs::default()
        };
        let mut engine = Engine::new(args, false, false);
        for id in 0..3 {
            engine.enqueue(seq(id, 60, 40));
        }
        let mut preempted = 0;
        let mut tokens = [0u32; 3];
        while let Some(out) = engine.pass(None) {
            preempted += out.preempted.len();
            for (id, _) in out.emitted {
                tokens[id as usize] += 1;
            }
        }
        assert!(
            preempted > 0,
            "three 100-token sequences cannot share 192 tokens of KV"
        );
        assert_eq!(tokens, [40, 40, 40], "recompute never re-emits a token");
    }

    #[test]
    fn sglang_admits_against_memory_with_output_reserves_and_still_finishes_everyone() {
        let sglang = EngineArgs {
            engine_type: EngineType::Sglang,
            block_size: 16,
            num_gpu_blocks: 64,
            ..EngineArgs::default()
        };
        let vllm = EngineArgs {
            engine_type: EngineType::Vllm,
            ..sglang.clone()
        };
        let first_pass = |args: EngineArgs| {
            let mut engine = Engine::new(args, false, false);
            for id in 0..3 {
                engine.enqueue(seq(id, 200, 300));
            }
            let admitted = engine.pass(None).expect("a pass").admitted.len();
            let mut tokens = [0u32; 3];
            while let Some(out) = engine.pass(None) {
                for (id, _) in out.emitted {
                    tokens[id as usize] += 1;
                }
            }
            (admitted, tokens)
        };
        let (admitted, tokens) = first_pass(sglang);
        assert_eq!(
            admitted, 2,
            "each needs 208 prompt + 300 reserved of 1024 tokens: the third waits"
        );
        assert_eq!(tokens[2], 300, "and is served later");
        assert_eq!(first_pass(vllm).0, 3, "vLLM counts blocks only");
    }
}
