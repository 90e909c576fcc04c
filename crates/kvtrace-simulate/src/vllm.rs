//! The vLLM and TRT-LLM mock engine: one `pass` schedules the running requests first, then
//! admits waiting ones against the pass's token budget (`max_num_batched_tokens`) and the KV
//! pool, and takes as long as the timing model says its prefill chunks and decode step take.
//! Every token of a pass is emitted at the pass's end. ([`super::sglang`] is SGLang's.)
//!
//! vLLM follows the reference mocker step for step, because over a long trace every detail
//! moves a figure: a request's blocks are allocated as one batch for the tokens it is
//! scheduled to compute (preempting the newest running request until they fit); the full
//! blocks it computed are cached at once, visible to the next request of the same pass; a
//! block a generated token completes is cached too (under a hash nothing else shares), and
//! on release every cached block stays in the pool, inactive, until an allocation evicts it.
//! TRT-LLM admits only what fits to completion and never preempts.
//!
//! In disaggregated serving a prefill-only engine keeps a finished request's KV (its
//! *source*) until the handoff releases it, and a decode engine queues transferred prompts
//! for room (its *destinations*): the first one waiting is retried whenever a request ends,
//! is preempted or releases its KV, and while it waits only requests that already hold
//! their KV may start.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::args::{EngineArgs, EngineType, EngineVersion, Preemption, WorkerType};
use super::blocks::{BlockPool, Reservation};
use super::engine::{
    pass_end_ms, Coast, DestinationQueue, KvConnector, PassOutput, Request, RequestId, Reserved,
};
use super::perf;

/// A request as the vLLM engine tracks it.
struct Sequence {
    pub id: RequestId,
    pub prompt_len: u32,
    pub output_len: u32,
    /// Chained hashes of the prompt's full blocks at this engine's block size.
    pub hashes: Arc<[u64]>,
    /// Tokens already generated (hidden ones on a prefill-only worker).
    pub generated: u32,
    computed: u32,
    /// Tokens the allocated blocks cover.
    allocated: u32,
    /// The pool copies of the allocated blocks, in order.
    table: Vec<u32>,
    /// Leading blocks of `table` that are cached (findable by other requests).
    cached: usize,
    /// Hashes of the full blocks beyond the prompt's, which generated tokens completed.
    decode_hashes: Vec<u64>,
    /// What those blocks hash to when a later prompt repeats them (else each is unique).
    output_hashes: Arc<[u64]>,
    /// The last block of the sequence is partial (not yet full, or full but not promoted).
    partial: bool,
    /// Got tokens in the current pass.
    scheduled: bool,
    /// Computed prompt tokens in the current pass.
    prompt_scheduled: bool,
    /// Its prompt's KV went to the external store (once, even if preempted later).
    stored: bool,
    /// Its prompt's KV arrives computed (a decode worker's handoff): admission costs no
    /// prefill. Cleared by preemption, after which the prompt is recomputed here.
    prefilled: bool,
    /// Preempted at least once (a fresh request is checked against the pool's size).
    preempted: bool,
    /// When this engine first heard of it (queued, or asked to hold its transferred
    /// prompt): a transferred prompt joins the queue at this place once it arrives.
    order: u64,
}

impl Sequence {
    fn new(r: Request) -> Self {
        Sequence {
            id: r.id,
            prompt_len: r.prompt_len,
            output_len: r.output_len.max(1),
            hashes: r.hashes,
            output_hashes: r.output_hashes,
            generated: 0,
            computed: 0,
            allocated: 0,
            table: Vec::new(),
            cached: 0,
            decode_hashes: Vec::new(),
            partial: false,
            scheduled: false,
            prompt_scheduled: false,
            stored: false,
            prefilled: r.prefilled,
            preempted: false,
            order: 0,
        }
    }

    fn len(&self) -> u32 {
        self.prompt_len + self.generated
    }

    fn full_blocks(&self) -> usize {
        self.hashes.len() + self.decode_hashes.len()
    }

    /// Blocks the sequence's tokens span: its full blocks, then a partial one.
    fn unique_len(&self) -> usize {
        self.full_blocks() + usize::from(self.partial)
    }

    fn full_hash(&self, block: usize) -> Option<u64> {
        match block.checked_sub(self.hashes.len()) {
            None => Some(self.hashes[block]),
            Some(d) => self.decode_hashes.get(d).copied(),
        }
    }

    fn full_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.hashes.iter().chain(self.decode_hashes.iter()).copied()
    }

    fn done(&self) -> bool {
        self.generated >= self.output_len
    }

    /// The blocks of `block` tokens it holds once it has generated its whole output.
    fn blocks_to_end(&self, block: u32) -> u64 {
        u64::from(
            self.prompt_len
                .saturating_add(self.output_len)
                .div_ceil(block),
        )
    }

    /// Its prompt is computed and held: it decodes.
    fn prompt_built(&self) -> bool {
        self.computed >= self.prompt_len && self.allocated >= self.prompt_len
    }
}

/// The prefill chunks of a pass: how many requests computed prompt tokens, the sum of their
/// prompt positions after and before the chunk (what the pass's time is charged by), and
/// every token the requests with prompt tokens computed, on any worker: a preempted
/// request recomputes its output too, and a decode worker recomputes without a charge.
#[derive(Clone, Copy, Default)]
struct Prefill {
    count: u64,
    isl: u64,
    prefix: u64,
    computed: u64,
}

impl Prefill {
    fn add(&mut self, before: u32, after: u32) {
        self.count += 1;
        self.isl += u64::from(after);
        self.prefix += u64::from(before);
    }
}

/// How a scheduling attempt ended.
enum Scheduled {
    /// Tokens were scheduled (possibly none, for a request that needs none).
    Yes { tokens: u32 },
    /// Nothing fits now; the request keeps its place.
    Blocked,
    /// The request itself was preempted to make room.
    SelfPreempted,
}

/// A transferred prompt waiting for room on its decode worker; `attempted` is the capacity
/// generation of the last attempt that found none (it is not retried until that changes).
pub struct VllmEngine {
    args: EngineArgs,
    pool: BlockPool,
    running: Vec<Sequence>,
    waiting: VecDeque<Sequence>,
    /// Prefill-only engines (disaggregation) charge no decode step and keep a finished
    /// request's KV until its handoff releases it.
    prefill_only: bool,
    /// Finished prefill-only requests whose KV waits for the decode side.
    sources: Vec<Sequence>,
    /// Transferred prompts in arrival order; only the first is tried.
    destinations: DestinationQueue<Sequence>,
    /// Transferred prompts with their room set aside, until activated.
    reserved: Vec<(Sequence, Reservation)>,
    /// Counts changes that may have freed room or a running slot.
    capacity_generation: u64,
    /// The next [`Sequence::order`].
    next_order: u64,
    /// Seeds [`Engine::unique_hash`]: unique per engine and block.
    next_decode_block: u64,
    /// The decode step's time, as the last pass asked it.
    decode_time: perf::Quantizer,
    /// When each pass of the last quiet step ended ([`Coast::coast_ends`]).
    coast_ends: Vec<f64>,
    /// The (pass, request) pairs of the last coast's block work, kept for their buffer.
    block_steps: Vec<(u32, u32)>,
    /// The last [`VllmEngine::prefix_cost`] asked for.
    last_cost: Cell<Option<PrefixCost>>,
    /// The worker's passes since it last held no request; see
    /// [`VllmEngine::defers_prefills`].
    wave_step: u64,
    /// The last pass that could start prefills left requests waiting.
    prefill_capacity_bound: bool,
}

/// The quiet passes an engine may run as one step (see [`Coast`]): at most
/// `passes`, each decoding `batch` requests that hold `context` tokens before the first.
pub(crate) struct Quiet {
    passes: u32,
    batch: u64,
    context: u64,
    /// Where the passes may take and fill blocks, and Dynamo 1.4.2's engine times a pass by
    /// the pool's occupancy: the blocks in use before the first, and each request's
    /// computed tokens and blocks held (see [`Quiet::taken`]).
    occupancy: Option<(u64, Vec<(u32, u32)>)>,
}

impl Quiet {
    /// The blocks the first `n` passes take, for requests of `computed` tokens holding
    /// `held` blocks each: each pass computes one more token, and a token past the last
    /// block takes a new one.
    fn taken(growth: &[(u32, u32)], block: u32, n: u32) -> u64 {
        growth
            .iter()
            .map(|&(computed, held)| u64::from((computed + n).div_ceil(block).saturating_sub(held)))
            .sum()
    }
}

impl Coast for VllmEngine {
    type Quiet = Quiet;

    fn is_drained(&self) -> bool {
        self.is_idle()
            && self.sources.is_empty()
            && self.destinations.is_empty()
            && self.reserved.is_empty()
    }

    fn passes(quiet: &Quiet) -> u32 {
        quiet.passes
    }

    fn coast_ends(&mut self) -> &mut Vec<f64> {
        &mut self.coast_ends
    }

    /// How many quiet passes may run from `start` (see [`Coast`]), with the batch and its
    /// context; `None` when the next pass would not be quiet. A quiet pass is a decode pass
    /// that changes little but token counts: nothing waits to be admitted, no request
    /// finishes, and none fills, takes or caches a block, except as below.
    ///
    /// Where no router hears the pool's stores and removals, a quiet pass may fill a block
    /// (it is cached) or take one (evicting as a pass would): both only change this pool,
    /// in an order the step keeps. The passes then stop before the one whose block the
    /// free room and the inactive copies could not give, where a pass would preempt.
    ///
    /// Requests may wait where every pass would refuse the head of the queue
    /// ([`VllmEngine::refuses_head_throughout`]), as under memory pressure most passes do.
    /// Prompts of a handoff may hold reserved room: it is taken from the pool already, and
    /// their activation waits on a transfer, which ends a step (no pass changes them). A
    /// prompt still waiting for room is tried again where a pass ends: none may wait. What
    /// a reservation evicted is published with the next pass's output, which a router
    /// hears: not a step's.
    fn quiet(&self, start: f64, before: f64) -> Option<Quiet> {
        let quiet = !self.prefill_only
            && self.destinations.is_empty()
            && !self.pool.has_unpublished_events()
            && !self.running.is_empty()
            && start < before
            && self.refuses_head_throughout();
        let batch = self.running.len() as u64;
        // A budget smaller than the batch leaves requests out of a pass.
        if !quiet || self.args.max_num_batched_tokens.is_some_and(|b| b < batch) {
            return None;
        }
        let block = self.args.block_size;
        let fills = !self.pool.tracks_events();
        let mut passes = u32::MAX;
        let mut context = 0u64;
        let mut growth = Vec::new();
        for seq in &self.running {
            let c = seq.computed;
            // A request in decode has every token computed but the one it generated last.
            if seq.generated == 0 || seq.done() || c + 1 != seq.len() {
                return None;
            }
            if fills {
                growth.push((c, seq.table.len() as u32));
            } else {
                let unique = seq.unique_len();
                if self.blocks_for(c + 1).min(unique) > self.blocks_for(seq.allocated).min(unique) {
                    return None;
                }
                // The pass whose token fills a block caches it (and the next starts one):
                // before it.
                passes = passes.min((block - (c + 1) % block) % block);
            }
            let to_last_token = seq.output_len - seq.generated - 1;
            passes = passes.min(to_last_token);
            context += u64::from(seq.len());
        }
        if fills {
            let room = self.pool.room_for_fresh();
            if Quiet::taken(&growth, block, passes) > room {
                // The most passes whose blocks the room gives.
                let (mut fit, mut over) = (0, passes);
                while over - fit > 1 {
                    let mid = fit + (over - fit) / 2;
                    match Quiet::taken(&growth, block, mid) <= room {
                        true => fit = mid,
                        false => over = mid,
                    }
                }
                passes = fit;
            }
        }
        let occupancy = (fills && self.args.engine_version == EngineVersion::Dynamo142)
            .then(|| (self.pool.active(), growth));
        Some(Quiet {
            passes,
            batch,
            context,
            occupancy,
        })
    }

    /// Quiet passes end no request, and refuse the head of the queue without rejecting it.
    fn passes_before_an_end(&self) -> u32 {
        self.quiet(0.0, f64::INFINITY).map_or(0, |q| q.passes)
    }

    fn least_pass_ms(&self) -> f64 {
        self.args.least_decode_pass_ms()
    }

    /// Timed as [`VllmEngine::pass_into`] times a decode pass.
    fn quiet_pass_end(&mut self, quiet: &mut Quiet, n: u64, at: f64) -> Option<f64> {
        let batch = quiet.batch;
        let context = quiet.context + batch * n;
        let model = match &quiet.occupancy {
            // The pass's blocks are taken before its time is charged.
            Some((active, growth)) => {
                let taken = Quiet::taken(growth, self.args.block_size, n as u32 + 1);
                self.decode_model_ms_at(batch, context, active + taken)
            }
            None => self.decode_model_ms(batch, context),
        };
        let decode_ms = self
            .decode_time
            .quantized(model, self.args.decode_divisor());
        Some(pass_end_ms(
            at,
            0.0,
            perf::quantized(0.0, self.args.speedup_ratio),
            decode_ms,
        ))
    }

    /// Applies quiet passes that ended at `ends`: every running request gains a token each,
    /// and each pass's blocks are taken and filled in the order a pass takes and fills
    /// them. None of them preempted or admitted a request; after them, a queue still
    /// waiting was left waiting for room.
    fn run_quiet(
        &mut self,
        _quiet: Quiet,
        ends: &[f64],
        tokens: &mut dyn FnMut(RequestId, &[f64]),
    ) {
        if ends.is_empty() {
            return;
        }
        let ran = ends.len() as u32;
        if !self.pool.tracks_events() {
            self.run_block_steps(ran);
        }
        for seq in &mut self.running {
            seq.computed += ran;
            seq.generated += ran;
            seq.allocated = seq.allocated.max(seq.computed);
            seq.scheduled = true;
            seq.prompt_scheduled = false;
            tokens(seq.id, ends);
        }
        // A pass that did not defer prefills finds the queue as it leaves it.
        self.prefill_capacity_bound = !self.waiting.is_empty();
    }
}

/// What [`VllmEngine::prefix_cost`] found for one waiting request, and when. Under memory
/// pressure the request at the head of the queue is refused pass after pass, and matching
/// its whole prompt against the pool each time was a tenth of such a run's instructions;
/// while the pool's [`BlockPool::changes`] stands still the match cannot differ.
#[derive(Clone, Copy)]
struct PrefixCost {
    id: RequestId,
    /// The request's length when asked: a preempted request comes back longer.
    len: u32,
    changes: u64,
    cost: (u32, u64),
}

impl VllmEngine {
    pub fn new(args: EngineArgs, track_events: bool, prefill_only: bool) -> VllmEngine {
        VllmEngine {
            pool: BlockPool::new(
                args.num_gpu_blocks,
                args.enable_prefix_caching,
                track_events,
            ),
            args,
            running: Vec::new(),
            waiting: VecDeque::new(),
            prefill_only,
            sources: Vec::new(),
            destinations: DestinationQueue::default(),
            reserved: Vec::new(),
            capacity_generation: 0,
            next_order: 0,
            next_decode_block: 0,
            decode_time: perf::Quantizer::default(),
            coast_ends: Vec::new(),
            block_steps: Vec::new(),
            last_cost: Cell::new(None),
            wave_step: 0,
            prefill_capacity_bound: false,
        }
    }

    /// The worker's pass count since it last held no request (AISimulate's wave step), set
    /// before each of its passes.
    pub fn set_wave_step(&mut self, step: u64) {
        self.wave_step = step;
    }

    /// AISimulate's vLLM cadence on attention-DP ranks: while a rank decodes, a pass that
    /// is not on every `prefill_schedule_interval`-th step of its worker starts no prefill
    /// work (a prompt in progress waits, and admission stops at the first request with
    /// more than one token to compute), unless the last pass that could left requests
    /// waiting for room.
    fn defers_prefills(&self) -> bool {
        let interval = u64::from(self.args.prefill_schedule_interval);
        self.has_prefill_cadence()
            && !self.wave_step.is_multiple_of(interval)
            && !self.prefill_capacity_bound
            && self.running.iter().any(Sequence::prompt_built)
    }

    /// Some passes may defer prefills ([`VllmEngine::defers_prefills`]): vLLM's
    /// attention-DP ranks with a `prefill_schedule_interval` over 1.
    fn has_prefill_cadence(&self) -> bool {
        self.args.dp_size > 1
            && self.args.engine_type == EngineType::Vllm
            && self.args.prefill_schedule_interval > 1
    }

    pub fn enqueue(&mut self, r: Request) {
        let seq = self.sequence(r);
        self.waiting.push_back(seq);
    }

    /// A new sequence, its output cut to what `max_model_len` leaves after its prompt: the
    /// scheduler stops generating there, in Dynamo 1.4.2's mocker and AISimulate's alike (a
    /// prompt at or past the limit is rejected when it comes up for admission). AISimulate's
    /// TRT-LLM scheduler also cuts it to what the pool holds after the prompt, since a
    /// request reserves its KV to completion; Dynamo 1.4.2's rejects such a request instead.
    fn sequence(&mut self, r: Request) -> Sequence {
        let mut seq = Sequence::new(r);
        seq.order = self.next_order;
        self.next_order += 1;
        seq.output_len = self
            .args
            .output_within_model_len(seq.prompt_len, seq.output_len);
        if self.args.engine_type == EngineType::Trtllm
            && self.args.engine_version == EngineVersion::Aisimulate013
        {
            if let Some(room) = self
                .args
                .kv_tokens()
                .checked_sub(u64::from(seq.prompt_len))
                .filter(|&r| r > 0)
            {
                seq.output_len = seq.output_len.min(u32::try_from(room).unwrap_or(u32::MAX));
            }
        }
        self.prepare(&mut seq);
        seq
    }

    /// Fixes a new sequence's block layout at this engine's block size.
    fn prepare(&mut self, seq: &mut Sequence) {
        if seq.table.is_empty() && seq.decode_hashes.is_empty() {
            let block = self.args.block_size;
            seq.partial = !seq.len().is_multiple_of(block);
            // Full prompt blocks without a content hash are nobody else's: give them one.
            let full = (seq.prompt_len / block) as usize;
            if seq.hashes.len() < full {
                let mut hashes = seq.hashes.to_vec();
                while hashes.len() < full {
                    hashes.push(self.unique_hash());
                }
                seq.hashes = Arc::from(hashes);
            }
        }
    }

    /// Queues a transferred prompt for room here; see [`super::engine::Engine`].
    pub fn reserve_destination(
        &mut self,
        r: Request,
        now: bool,
    ) -> Result<Option<Reserved>, RequestId> {
        if self.blocks_for(r.prompt_len) as u64 > self.pool.capacity() {
            return Err(r.id);
        }
        let seq = self.sequence(r);
        // TRT-LLM holds a transferred prompt to completion: one that could never fit so
        // is refused, as AISimulate refuses it.
        if self.args.engine_type == EngineType::Trtllm
            && seq.blocks_to_end(self.args.block_size) > self.pool.capacity()
        {
            return Err(seq.id);
        }
        self.destinations.push_back(seq);
        Ok(if now { self.retry_destinations() } else { None })
    }

    /// Tries the first waiting destination once more, if room or a running slot may have
    /// appeared since its last attempt: vLLM reuses the prompt blocks this pool already
    /// caches and sets aside fresh ones for the rest. AISimulate's TRT-LLM takes it only
    /// with room to complete beside every running request and every handoff already
    /// promised room, and sets aside fresh blocks for the whole prompt: no prefix found
    /// here is credited.
    pub fn retry_destinations(&mut self) -> Option<Reserved> {
        let seq = self.destinations.front_due(self.capacity_generation)?;
        let (hashes, unique) = (Arc::clone(&seq.hashes), seq.unique_len());
        let to_end = seq.blocks_to_end(self.args.block_size);
        if self
            .args
            .max_num_seqs
            .is_some_and(|m| self.running.len() as u64 >= m)
        {
            return None;
        }
        let (prefix, fresh) = if self.args.engine_type == EngineType::Trtllm {
            if to_end > self.trtllm_room() {
                return None;
            }
            (Vec::new(), unique)
        } else {
            let (hit, _) = self.pool.match_prefix(&hashes);
            (hashes[..hit].to_vec(), unique - hit)
        };
        let reservation = self.pool.reserve(&prefix, fresh as u32)?;
        let seq = self.destinations.pop_front().expect("front");
        let reserved = Reserved {
            id: seq.id,
            missing_tokens: fresh as u32 * self.args.block_size,
        };
        self.reserved.push((seq, reservation));
        Some(reserved)
    }

    /// The transfer of a reserved prompt is complete: the request takes its blocks (the
    /// full ones cached) and joins the queue with its prompt computed. Then the next
    /// destination may fit; its reservation is returned.
    pub fn activate(&mut self, id: RequestId) -> Option<Reserved> {
        let at = self.reserved.iter().position(|(s, _)| s.id == id)?;
        let (seq, mut reservation) = self.reserved.remove(at);
        let prompt_len = seq.prompt_len;
        self.running.push(seq);
        let i = self.running.len() - 1;
        let ids = self.pool.take_prefix(&mut reservation);
        let seq = &mut self.running[i];
        seq.cached = ids.len();
        seq.table = ids;
        while self.running[i].table.len() < self.running[i].unique_len() {
            let id = self.pool.take_fresh(&mut reservation);
            self.running[i].table.push(id);
        }
        self.pool.cancel(reservation);
        let seq = &mut self.running[i];
        seq.allocated = prompt_len;
        seq.computed = prompt_len;
        self.finalize(i, 0, prompt_len);
        let seq = self.running.pop().expect("just pushed");
        // Where it would stand had it waited here since it was handed over, as AISimulate
        // restores it: ahead of everything queued after it asked for room. Dynamo 1.4.2's
        // queues it behind everything.
        let at = match self.args.engine_version {
            EngineVersion::Aisimulate013 => self
                .waiting
                .iter()
                .position(|w| w.order > seq.order)
                .unwrap_or(self.waiting.len()),
            EngineVersion::Dynamo142 => self.waiting.len(),
        };
        self.waiting.insert(at, seq);
        self.retry_destinations()
    }

    /// The decode side has the KV of a held request: free it here.
    pub fn release_source(&mut self, id: RequestId) {
        if let Some(at) = self.sources.iter().position(|s| s.id == id) {
            let mut seq = self.sources.remove(at);
            self.release(&mut seq);
            self.capacity_generation += 1;
        }
    }

    /// A block hash no prompt shares (a block of generated tokens, or one without content).
    fn unique_hash(&mut self) -> u64 {
        self.next_decode_block += 1;
        xxh3_64_with_seed(&self.next_decode_block.to_le_bytes(), 0xDEC0DE)
    }

    /// No request to schedule (held sources and destinations not yet activated wait on
    /// the handoff, not on a pass).
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

    /// Runs one pass into `out` (emptied first, its buffers kept); `false` when there is
    /// nothing to do. With a connector, admissions load what the external store holds beyond
    /// the GPU prefix hit, and completed prompts are stored.
    pub fn pass_into(
        &mut self,
        mut connector: Option<&mut dyn KvConnector>,
        out: &mut PassOutput,
    ) -> bool {
        out.clear();
        let mut budget = self.args.max_num_batched_tokens.unwrap_or(u64::MAX);
        let mut prefill = Prefill::default();
        for seq in &mut self.running {
            seq.scheduled = false;
            seq.prompt_scheduled = false;
        }
        let defer = self.defers_prefills();
        let mut scheduled_any = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if defer && !self.running[i].prompt_built() {
                i += 1;
                continue;
            }
            match self.schedule(i, &mut budget, &mut prefill, out, 0, false) {
                Scheduled::Yes { tokens } => {
                    scheduled_any |= tokens > 0;
                    i += 1;
                }
                Scheduled::SelfPreempted => {}
                Scheduled::Blocked => break,
            }
        }
        let mut load_ms = 0.0;
        if out.preempted.is_empty() {
            let (admitted, ms) = self.admit(&mut budget, &mut prefill, out, &mut connector, defer);
            scheduled_any |= admitted;
            load_ms = ms;
        }
        if !defer && out.preempted.is_empty() {
            self.prefill_capacity_bound = !self.waiting.is_empty();
        }
        if let Some(c) = connector {
            for seq in &mut self.running {
                if !seq.stored && seq.computed >= seq.prompt_len {
                    seq.stored = true;
                    c.store(seq.id);
                }
            }
        }
        let ready = self.ready();
        if !scheduled_any && ready == 0 && out.rejected.is_empty() && out.preempted.is_empty() {
            return false;
        }
        let prefill_ms = if prefill.count > 0 {
            perf::prefill_ms(
                prefill.count,
                prefill.isl / prefill.count,
                prefill.prefix / prefill.count,
            )
        } else {
            0.0
        };
        let decode_ms = if self.prefill_only || ready == 0 {
            0.0
        } else if self.args.engine_version == EngineVersion::Aisimulate013 {
            let (decoding, context) = self.decoding();
            self.decode_model_ms(decoding, context)
        } else {
            self.decode_model_ms(ready, 0)
        };
        let speedup = self.args.speedup_ratio;
        out.load_ms = load_ms;
        out.prefill_ms = perf::quantized(prefill_ms, speedup);
        out.prefill_tokens = prefill.computed;
        out.decode_ms = self
            .decode_time
            .quantized(decode_ms, self.args.decode_divisor());
        self.emit(out);
        self.pool.move_events_to(&mut out.kv_events);
        true
    }

    /// The decode step's model milliseconds for `batch` requests holding `context` tokens in
    /// all: AISimulate's engine charges by context, Dynamo 1.4.2's by the pool's occupancy.
    fn decode_model_ms(&self, batch: u64, context: u64) -> f64 {
        self.decode_model_ms_at(batch, context, self.pool.active())
    }

    /// [`VllmEngine::decode_model_ms`] with `active` blocks in use.
    fn decode_model_ms_at(&self, batch: u64, context: u64, active: u64) -> f64 {
        let block = u64::from(self.args.block_size);
        let total = self.pool.capacity() * block;
        match self.args.engine_version {
            EngineVersion::Aisimulate013 => perf::decode_ms(batch, context, total),
            EngineVersion::Dynamo142 => perf::decode_ms(batch, active * block, total),
        }
    }

    /// The block work of `ran` quiet passes: in each pass, in running order, the requests
    /// whose token takes a new block or fills one, as [`VllmEngine::schedule`] and
    /// [`VllmEngine::emit`] would treat them. Leaves every request's token counts as they
    /// were (the caller adds the passes).
    fn run_block_steps(&mut self, ran: u32) {
        let block = self.args.block_size;
        let mut steps = std::mem::take(&mut self.block_steps);
        steps.clear();
        for (i, seq) in self.running.iter().enumerate() {
            let c = seq.computed;
            // Pass `k` computes token `c + k`: it takes a block where that token starts
            // one, and fills one where the token after it would start the next.
            let take = (block - c % block) % block;
            let fill = (block - (c + 1) % block) % block;
            for first in [take, fill] {
                steps.extend((first..ran).step_by(block as usize).map(|k| (k, i as u32)));
            }
        }
        if steps.is_empty() {
            self.block_steps = steps;
            return;
        }
        steps.sort_unstable();
        steps.dedup();
        let bases: Vec<(u32, u32)> = self
            .running
            .iter()
            .map(|s| (s.computed, s.generated))
            .collect();
        for &(k, i) in &steps {
            let i = i as usize;
            let (computed, generated) = bases[i];
            let seq = &mut self.running[i];
            seq.computed = computed + k;
            seq.generated = generated + k;
            let (before, after) = (seq.computed, seq.computed + 1);
            let taken = self.allocate(i, after, 0);
            assert!(taken, "a quiet pass's block was counted in the room");
            self.running[i].computed = after;
            self.finalize(i, before, after);
            let seq = &mut self.running[i];
            seq.generated += 1;
            if seq.len() % block == 1 || block == 1 {
                if seq.partial {
                    self.promote(i);
                }
                self.running[i].partial = true;
            }
        }
        for (seq, &(computed, generated)) in self.running.iter_mut().zip(&bases) {
            seq.computed = computed;
            seq.generated = generated;
        }
        self.block_steps = steps;
    }

    /// Whether every quiet pass from now on would refuse the head of the queue, changing
    /// nothing (an empty queue is refused nothing): no request may start (`max_num_seqs`),
    /// or the head, which neither waits to be rejected nor arrived with its KV, does not
    /// fit the pool. Quiet passes only take blocks, so a head that does not fit now does
    /// not fit later: vLLM's free blocks only shrink, and TRT-LLM's room for one more
    /// request to complete stays as it is (each block a running request takes was counted
    /// in what it needed to finish). The head's blocks in use by running requests stay the
    /// same unless a running request's generated blocks are ones a later prompt repeats,
    /// which may be the head's. Where prefills may be deferred (vLLM's attention-DP cadence),
    /// whether a pass defers them depends on its wave step: only a queue the last pass left
    /// waiting (`prefill_capacity_bound`), which no pass defers, qualifies.
    fn refuses_head_throughout(&self) -> bool {
        let Some(head) = self.waiting.front() else {
            return true;
        };
        if self.has_prefill_cadence() && !self.prefill_capacity_bound {
            return false;
        }
        if self
            .args
            .max_num_seqs
            .is_some_and(|m| self.running.len() as u64 >= m)
        {
            return true;
        }
        let repeated = |s: &Sequence| s.output_hashes.len() > s.decode_hashes.len();
        if head.prefilled
            || self.args.refuses_prompt(head.prompt_len)
            || self.running.iter().any(repeated)
        {
            return false;
        }
        let (_, active_cached) = self.prefix_cost(head);
        !self.too_big(head) && !self.fits(head, active_cached)
    }

    /// A sequence larger than the pool can never run again: rejected, where the reference
    /// mocker checks fresh requests only and dead-ends on a preempted one. TRT-LLM's fresh
    /// request reserves its KV to completion.
    fn too_big(&self, seq: &Sequence) -> bool {
        match self.args.engine_type {
            EngineType::Trtllm => {
                !seq.preempted && seq.blocks_to_end(self.args.block_size) > self.pool.capacity()
            }
            _ => self.blocks_for(seq.len()) as u64 > self.pool.capacity(),
        }
    }

    /// Running requests whose every token is computed: they emit this pass.
    fn ready(&self) -> u64 {
        self.running
            .iter()
            .filter(|s| s.scheduled && s.computed == s.len() && !s.done())
            .count() as u64
    }

    /// AISimulate's decode step: the requests that emit this pass less those whose first
    /// token an aggregated worker samples from the prefill forward pass, and the sum of
    /// their context lengths.
    fn decoding(&self) -> (u64, u64) {
        let aggregated = self.args.worker_type == WorkerType::Aggregated;
        self.running
            .iter()
            .filter(|s| s.scheduled && s.computed == s.len() && !s.done())
            .filter(|s| !(aggregated && s.generated == 0 && s.prompt_scheduled))
            .fold((0, 0), |(n, tokens), s| {
                (n + 1, tokens + u64::from(s.len()))
            })
    }

    /// The prompt tokens a waiting request finds cached, and the blocks of those that other
    /// running requests hold (vLLM recomputes the last token of a fully cached context, in
    /// whole blocks).
    fn prefix_cost(&self, seq: &Sequence) -> (u32, u64) {
        let (id, len, changes) = (seq.id, seq.len(), self.pool.changes());
        match self.last_cost.get() {
            Some(c) if c.id == id && c.len == len && c.changes == changes => c.cost,
            _ => {
                let cost = self.match_cost(seq);
                self.last_cost.set(Some(PrefixCost {
                    id,
                    len,
                    changes,
                    cost,
                }));
                cost
            }
        }
    }

    /// [`VllmEngine::prefix_cost`], computed.
    fn match_cost(&self, seq: &Sequence) -> (u32, u64) {
        let block = self.args.block_size;
        let (hit, active) = self.pool.match_prefix_iter(seq.full_hashes());
        let len = seq.len();
        let mut cached = (hit as u32 * block).min(len);
        let mut active_cached = (active as u32 * block).min(len);
        if self.args.engine_type == EngineType::Vllm && !seq.done() {
            let max_cached = (len.saturating_sub(1) / block) * block;
            if cached > max_cached {
                cached = max_cached;
                active_cached = active_cached.min(max_cached);
            }
        }
        (cached, u64::from(active_cached / block))
    }

    /// Schedules running request `i` — or, when `admitting`, the waiting request just
    /// placed at the end of `running`, which is not yet running and so never a victim — as
    /// many of its remaining tokens as the budget allows (`cached` of them found in the
    /// prefix cache), after allocating the blocks they need as one batch and preempting to
    /// make room.
    fn schedule(
        &mut self,
        i: usize,
        budget: &mut u64,
        prefill: &mut Prefill,
        out: &mut PassOutput,
        cached: u32,
        admitting: bool,
    ) -> Scheduled {
        let block = self.args.block_size;
        let seq = &self.running[i];
        let before = seq.computed + cached;
        let prompt_len = seq.prompt_len;
        let prompt_before = before.min(prompt_len);
        let remaining = seq.len().saturating_sub(before);
        if prompt_len > prompt_before
            && !self.args.enable_chunked_prefill
            && u64::from(prompt_len - prompt_before) > *budget
        {
            return Scheduled::Blocked;
        }
        let take = u64::from(remaining).min(*budget) as u32;
        if take == 0 && remaining > 0 {
            return Scheduled::Blocked;
        }
        let after = before + take;
        let mut i = i;
        loop {
            match self.allocate(i, after, cached / block) {
                true => break,
                false => match self.preempt(admitting, out) {
                    Some(victim) if victim == i => return Scheduled::SelfPreempted,
                    Some(victim) => {
                        if victim < i {
                            i -= 1;
                        }
                    }
                    None => return Scheduled::Blocked,
                },
            }
        }
        let seq = &mut self.running[i];
        seq.computed = after;
        self.finalize(i, before, after);
        let seq = &mut self.running[i];
        seq.scheduled = true;
        let prompt_after = after.min(prompt_len);
        let prompt_tokens = prompt_after - prompt_before;
        seq.prompt_scheduled = prompt_tokens > 0;
        if prompt_tokens > 0 {
            prefill.computed += u64::from(take);
            if self.args.worker_type != WorkerType::Decode {
                prefill.add(prompt_before, prompt_after);
            }
        }
        *budget -= u64::from(take);
        Scheduled::Yes { tokens: take }
    }

    /// Allocates the blocks request `i` needs to hold `target` tokens, reusing the first
    /// `reusable` cached blocks on its first allocation. All or nothing.
    fn allocate(&mut self, i: usize, target: u32, reusable: u32) -> bool {
        let seq = &self.running[i];
        let unique = seq.unique_len();
        let have = self.blocks_for(seq.allocated).min(unique);
        let want = self.blocks_for(target).min(unique);
        if want <= have {
            self.running[i].allocated = self.running[i].allocated.max(target);
            return true;
        }
        let reuse = if have == 0 {
            (reusable as usize).min(want)
        } else {
            0
        };
        let prefix: Vec<u64> = (0..reuse).filter_map(|b| seq.full_hash(b)).collect();
        let Some(mut reservation) = self.pool.reserve(&prefix, (want - have - reuse) as u32) else {
            return false;
        };
        let ids = self.pool.take_prefix(&mut reservation);
        let seq = &mut self.running[i];
        if !ids.is_empty() {
            // The reused prefix is the first allocation, and it is cached already.
            seq.table.extend(ids);
            seq.cached = seq.table.len();
        }
        for _ in have + reuse..want {
            let id = self.pool.take_fresh(&mut reservation);
            self.running[i].table.push(id);
        }
        self.pool.cancel(reservation);
        self.running[i].allocated = target;
        true
    }

    /// Caches the full blocks request `i` completed computing between `before` and `after`
    /// tokens — visible to the next request scheduled — and, when that completed its whole
    /// context on a block boundary, the last block too.
    fn finalize(&mut self, i: usize, before: u32, after: u32) {
        if !self.pool.prefix_caching() {
            return;
        }
        let block = self.args.block_size;
        let seq = &mut self.running[i];
        let completed = ((after / block) as usize).min(seq.table.len());
        let mut b = ((before / block) as usize).max(seq.cached);

        while b < completed && b < seq.full_blocks() {
            let hash = seq.full_hash(b).expect("a full block");
            self.pool.cache(seq.table[b], hash);
            seq.cached = b + 1;
            b += 1;
        }
        if after == seq.len() && after.is_multiple_of(block) && after > 0 && seq.partial {
            self.promote(i);
        }
    }

    /// The sequence's partial last block is full: it gets a hash of its own (its tokens
    /// include generated ones no other request shares) and, when allocated, is cached.
    fn promote(&mut self, i: usize) {
        let seq = &self.running[i];
        let hash = match seq.output_hashes.get(seq.decode_hashes.len()) {
            Some(&h) => h,
            None => self.unique_hash(),
        };
        let seq = &mut self.running[i];
        seq.decode_hashes.push(hash);
        seq.partial = false;
        let b = seq.full_blocks() - 1;
        if self.pool.prefix_caching() && b < seq.table.len() && b == seq.cached {
            self.pool.cache(seq.table[b], hash);
            seq.cached = b + 1;
        }
    }

    /// Preempts the newest running request (the oldest under FIFO mode) — not the last
    /// entry while `admitting` it — putting it back at the head of the queue with its
    /// blocks released; returns its index, or `None` when preemption is not allowed
    /// (TRT-LLM) or nothing else runs.
    fn preempt(&mut self, admitting: bool, out: &mut PassOutput) -> Option<usize> {
        let candidates = self.running.len() - usize::from(admitting);
        if self.args.engine_type == EngineType::Trtllm || candidates == 0 {
            return None;
        }
        let victim = match self.args.preemption {
            Preemption::Lifo => candidates - 1,
            Preemption::Fifo => 0,
        };
        let mut seq = self.running.remove(victim);
        self.release(&mut seq);
        self.capacity_generation += 1;
        seq.computed = 0;
        seq.prefilled = false;
        seq.preempted = true;
        out.preempted.push(seq.id);
        self.waiting.push_front(seq);
        Some(victim)
    }

    /// Releases every block a request holds, last first, so its suffix is evicted before a
    /// prefix other requests share.
    fn release(&mut self, seq: &mut Sequence) {
        for &id in seq.table.iter().rev() {
            self.pool.release(id);
        }
        seq.table.clear();
        seq.cached = 0;
        seq.allocated = 0;
    }

    /// Whether a waiting request may enter: vLLM reserves its current blocks less the
    /// cached ones others hold; TRT-LLM its blocks to completion, in [`VllmEngine::trtllm_room`].
    fn fits(&self, seq: &Sequence, active_cached: u64) -> bool {
        if self.args.engine_type == EngineType::Trtllm {
            return seq
                .blocks_to_end(self.args.block_size)
                .saturating_sub(active_cached)
                <= self.trtllm_room();
        }
        let free = self.pool.capacity().saturating_sub(self.pool.active());
        (self.blocks_for(seq.len()) as u64).saturating_sub(active_cached) <= free
    }

    /// The blocks a sequence still has to allocate to complete.
    fn to_finish(&self, seq: &Sequence) -> u64 {
        seq.blocks_to_end(self.args.block_size)
            .saturating_sub(self.blocks_for(seq.allocated) as u64)
    }

    /// TRT-LLM's room for one more request to run to completion: the free blocks less what
    /// every running request still needs to finish and, in disaggregated serving, less
    /// what the transferred prompts not yet running were promised beyond their prompt
    /// (the held ones' reservations hold the prompt alone; the activated ones wait with
    /// it allocated).
    fn trtllm_room(&self) -> u64 {
        let free = self.pool.capacity().saturating_sub(self.pool.active());
        let running: u64 = self.running.iter().map(|s| self.to_finish(s)).sum();
        let held: u64 = self
            .reserved
            .iter()
            .map(|(s, _)| {
                s.blocks_to_end(self.args.block_size)
                    .saturating_sub(self.blocks_for(s.prompt_len) as u64)
            })
            .sum();
        // Only a decode worker queues prompts that arrived with their KV.
        let activated: u64 = match self.args.worker_type {
            WorkerType::Decode => self
                .waiting
                .iter()
                .filter(|s| s.prefilled)
                .map(|s| self.to_finish(s))
                .sum(),
            _ => 0,
        };
        free.saturating_sub(running)
            .saturating_sub(held.saturating_add(activated))
    }

    /// Admits waiting requests in order while the budget, the sequence limit and the pool
    /// allow; the first that does not fit blocks the ones behind it. While a transferred
    /// prompt still waits for room, only requests that arrived with their KV may enter
    /// (a fresh one would take the room the transfer waits for); while prefills are
    /// deferred (`defer`), none with more than one token to compute does. Returns whether
    /// any tokens were scheduled and the time spent loading from the connector.
    fn admit(
        &mut self,
        budget: &mut u64,
        prefill: &mut Prefill,
        out: &mut PassOutput,
        connector: &mut Option<&mut dyn KvConnector>,
        defer: bool,
    ) -> (bool, f64) {
        let block = self.args.block_size;
        let mut load_ms = 0.0;
        let mut scheduled = false;
        let transfer_waits = !self.destinations.is_empty();
        while out.preempted.is_empty() {
            if self
                .args
                .max_num_seqs
                .is_some_and(|m| self.running.len() as u64 >= m)
            {
                break;
            }
            let next = if transfer_waits {
                self.waiting.iter().position(|s| s.prefilled)
            } else {
                (!self.waiting.is_empty()).then_some(0)
            };
            let Some(at) = next else {
                break;
            };
            let seq = &self.waiting[at];
            if self.args.refuses_prompt(seq.prompt_len) {
                let seq = self.waiting.remove(at).expect("present");
                out.rejected.push(seq.id);
                continue;
            }
            if seq.prefilled {
                // Its KV arrived with its blocks: it enters as it is.
                let seq = self.waiting.remove(at).expect("present");
                let id = seq.id;
                self.running.push(seq);
                let i = self.running.len() - 1;
                if let Scheduled::Yes { tokens } = self.schedule(i, budget, prefill, out, 0, true) {
                    out.admitted.push((id, 0));
                    scheduled = true;
                    if tokens == 0 && *budget == 0 {
                        break;
                    }
                }
                continue;
            }
            if self.too_big(seq) {
                let seq = self.waiting.pop_front().expect("front");
                out.rejected.push(seq.id);
                continue;
            }
            let (id, len) = (seq.id, seq.len());
            let (cached, active_cached) = self.prefix_cost(seq);
            if !self.fits(seq, active_cached) || defer && len - cached.min(len) > 1 {
                break;
            }
            // The store may extend the GPU hit.
            let external = match connector.as_deref_mut() {
                Some(c) => c.lookup(id).min(len - 1).saturating_sub(cached),
                None => 0,
            };
            let seq = self.waiting.pop_front().expect("front");
            self.running.push(seq);
            let i = self.running.len() - 1;
            // What the store holds arrives computed: its blocks come first (cached as they
            // are filled); the rest is scheduled.
            let arrived = cached + external;
            let outcome = if arrived > cached {
                if self.allocate(i, arrived, cached / block) {
                    self.running[i].computed = arrived;
                    self.finalize(i, cached, arrived);
                    self.schedule(i, budget, prefill, out, 0, true)
                } else {
                    Scheduled::Blocked
                }
            } else {
                self.schedule(i, budget, prefill, out, cached, true)
            };
            if let Some(c) = connector.as_deref_mut() {
                let loaded = matches!(outcome, Scheduled::Yes { .. });
                load_ms += c.load(id, cached, if loaded { external } else { 0 });
            }
            match outcome {
                Scheduled::Yes { tokens } => {
                    out.admitted.push((id, cached.min(len)));
                    scheduled |= tokens > 0 || self.running[i].computed == len;
                    if tokens == 0 && *budget == 0 {
                        break;
                    }
                }
                Scheduled::Blocked | Scheduled::SelfPreempted => {
                    if let Some(mut seq) = self.running.pop() {
                        self.release(&mut seq);
                        seq.computed = 0;
                        self.waiting.push_front(seq);
                    }
                    break;
                }
            }
        }
        (scheduled, load_ms)
    }

    /// Every scheduled request whose tokens are all computed emits one; a generated token
    /// that starts a new block completes the previous one; finished ones release their
    /// blocks.
    fn emit(&mut self, out: &mut PassOutput) {
        let block = self.args.block_size;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            if !seq.scheduled || seq.computed != seq.len() || seq.done() {
                i += 1;
                continue;
            }
            seq.generated += 1;
            if seq.len() % block == 1 || block == 1 {
                if seq.partial {
                    self.promote(i);
                }
                self.running[i].partial = true;
            }
            let seq = &mut self.running[i];
            let done = seq.done();
            out.emitted.push((seq.id, done));
            if done {
                let mut seq = self.running.remove(i);
                self.capacity_generation += 1;
                if self.prefill_only {
                    out.held.push(seq.id);
                    self.sources.push(seq);
                } else {
                    self.release(&mut seq);
                }
            } else {
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::KvEvent;

    fn seq(id: RequestId, prompt: u32, output: u32) -> Request {
        Request::new(id, prompt, output, Arc::from(Vec::new()))
    }

    fn pass(engine: &mut VllmEngine) -> Option<PassOutput> {
        let mut out = PassOutput::default();
        engine.pass_into(None, &mut out).then_some(out)
    }

    /// Runs passes until idle; returns each request's token count.
    fn drain(engine: &mut VllmEngine, requests: usize) -> (Vec<u32>, Vec<RequestId>) {
        let (mut tokens, mut rejected) = (vec![0; requests], Vec::new());
        while let Some(out) = pass(engine) {
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
        let mut engine = VllmEngine::new(args, false, false);
        engine.enqueue(seq(0, 1000, 3000));
        engine.enqueue(seq(1, 100, 5));
        let (tokens, rejected) = drain(&mut engine, 2);
        assert_eq!(rejected, [0]);
        assert_eq!(tokens, [0, 5]);
    }

    #[test]
    fn a_trtllm_destination_waits_for_room_to_complete_and_is_credited_no_prefix() {
        let args = EngineArgs {
            engine_type: EngineType::Trtllm,
            engine_version: EngineVersion::Aisimulate013,
            worker_type: WorkerType::Decode,
            block_size: 10,
            num_gpu_blocks: 20,
            ..EngineArgs::default()
        };
        let prompt = |first: u64| -> Arc<[u64]> { (first..first + 5).collect() };
        let mut engine = VllmEngine::new(args.clone(), false, false);
        // 5 prompt blocks, 10 to completion, in an empty pool of 20: room for all of it.
        let a = engine.reserve_destination(Request::prefilled(0, 50, 50, prompt(1)), true);
        assert_eq!(
            a.map(|r| r.map(|r| (r.id, r.missing_tokens))),
            Ok(Some((0, 50)))
        );
        // 11 to completion: 15 blocks are free, but the first was promised 5 beyond its
        // prompt, which leaves 10 (vLLM would take its 5 prompt blocks now).
        let b = engine.reserve_destination(Request::prefilled(1, 50, 60, prompt(6)), true);
        assert!(matches!(b, Ok(None)));
        // Activated, the first still waits with its tail promised: the second still waits.
        engine.activate(0);
        assert!(engine.retry_destinations().is_none());
        assert_eq!(engine.trtllm_room(), 10);

        // The same prompt again, cached here, still comes over whole.
        let mut engine = VllmEngine::new(args, false, false);
        engine
            .reserve_destination(Request::prefilled(0, 50, 1, prompt(1)), true)
            .expect("fits");
        engine.activate(0);
        let again = engine.reserve_destination(Request::prefilled(1, 50, 1, prompt(1)), true);
        assert_eq!(again.map(|r| r.map(|r| r.missing_tokens)), Ok(Some(50)));
    }

    #[test]
    fn a_full_pool_preempts_the_newest_and_everyone_still_finishes() {
        let args = EngineArgs {
            block_size: 16,
            num_gpu_blocks: 12,
            ..EngineArgs::default()
        };
        let mut engine = VllmEngine::new(args, false, false);
        for id in 0..3 {
            engine.enqueue(seq(id, 60, 40));
        }
        let mut preempted = 0;
        let mut tokens = [0u32; 3];
        while let Some(out) = pass(&mut engine) {
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
    fn what_a_reservation_evicted_is_published_by_a_pass_before_any_step() {
        // A decode worker under a KV-aware router: a finished request leaves its prompt
        // blocks cached and inactive; a handoff's reservation then evicts some, between
        // passes. Those removals go out with the next pass's output, so that pass may not
        // be part of a step, whose passes publish nothing; the one after it may.
        let args = EngineArgs {
            block_size: 16,
            num_gpu_blocks: 8,
            worker_type: WorkerType::Decode,
            ..EngineArgs::default()
        };
        let mut engine = VllmEngine::new(args, true, false);
        let hashes = |first: u64, n: u64| -> Arc<[u64]> { (first..first + n).collect() };
        let hand_over = |engine: &mut VllmEngine, r: Request| {
            let id = r.id;
            engine
                .reserve_destination(r, true)
                .expect("fits")
                .expect("room");
            engine.activate(id);
        };
        hand_over(&mut engine, Request::prefilled(0, 64, 1, hashes(1, 4)));
        hand_over(&mut engine, Request::prefilled(1, 32, 40, hashes(10, 2)));
        while engine.quiet(0.0, f64::INFINITY).is_none() {
            pass(&mut engine).expect("a pass");
        }
        let r = engine.reserve_destination(Request::prefilled(2, 64, 5, hashes(20, 4)), true);
        assert!(
            matches!(r, Ok(Some(_))),
            "room for the prompt, made by evicting"
        );
        assert!(engine.quiet(0.0, f64::INFINITY).is_none());
        let out = pass(&mut engine).expect("a pass");
        assert!(out
            .kv_events
            .iter()
            .any(|e| matches!(e, KvEvent::Removed(_))));
        assert!(
            engine.quiet(0.0, f64::INFINITY).is_some(),
            "quiet again beside the reserved prompt"
        );
    }

    #[test]
    fn a_block_computed_earlier_in_the_pass_is_a_hit_for_the_next_request() {
        let args = EngineArgs {
            block_size: 16,
            num_gpu_blocks: 64,
            ..EngineArgs::default()
        };
        let mut engine = VllmEngine::new(args, false, false);
        let shared: Arc<[u64]> = Arc::from(vec![1u64, 2]);
        engine.enqueue(Request::new(0, 40, 2, shared.clone()));
        engine.enqueue(Request::new(1, 40, 2, shared));
        let out = pass(&mut engine).expect("a pass");
        assert_eq!(out.admitted, [(0, 0), (1, 32)]);
    }
}
