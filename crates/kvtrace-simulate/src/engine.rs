//! What every mock engine shares: the request it is handed, what a pass reports, the
//! external KV store it may consult, and [`Engine`], which puts the vLLM/TRT-LLM engine
//! ([`super::vllm`]) and the SGLang one ([`super::sglang`]) behind one interface.
//!
//! Disaggregated serving moves a request between engines in steps the simulation drives
//! (see [`super::handoff`]): a prefill-only engine finishes the request and *holds* its KV
//! (a source, reported in [`PassOutput::held`]) until [`Engine::release_source`]; a decode
//! engine takes the transferred prompt with [`Engine::reserve_destination`] — queued first
//! come, first served until there is room, each success reported as [`Reserved`] — and
//! [`Engine::activate`] once the transfer is complete, after which the request is admitted
//! with its prompt computed.

use std::collections::VecDeque;
use std::sync::Arc;

use super::args::{EngineArgs, EngineType};
use super::blocks::KvEvent;
use super::sglang::SglangEngine;
use super::vllm::VllmEngine;

/// Index of a request in the simulation's request table.
pub type RequestId = u32;

/// A request as the simulation hands it to an engine.
#[derive(Clone, Debug)]
pub struct Request {
    pub id: RequestId,
    pub prompt_len: u32,
    /// Tokens to generate (at least one).
    pub output_len: u32,
    /// Chained hashes of the prompt's full blocks at the engine's block size.
    pub hashes: Arc<[u64]>,
    /// Chained hashes of the later full blocks, which generated tokens complete, when a later
    /// prompt repeats this output (a `mooncake-delta` session). Empty: those blocks hold
    /// content no other request has.
    pub output_hashes: Arc<[u64]>,
    /// Its prompt's KV arrives computed (a decode worker's handoff).
    pub prefilled: bool,
}

impl Request {
    pub fn new(id: RequestId, prompt_len: u32, output_len: u32, hashes: Arc<[u64]>) -> Request {
        Request {
            id,
            prompt_len,
            output_len: output_len.max(1),
            hashes,
            output_hashes: Arc::from(Vec::new()),
            prefilled: false,
        }
    }

    /// The same request, its generated blocks hashed as `output_hashes`.
    pub fn with_output_hashes(self, output_hashes: Arc<[u64]>) -> Request {
        Request {
            output_hashes,
            ..self
        }
    }

    /// A request whose prompt KV was computed elsewhere and is transferred here.
    pub fn prefilled(
        id: RequestId,
        prompt_len: u32,
        output_len: u32,
        hashes: Arc<[u64]>,
    ) -> Request {
        Request {
            prefilled: true,
            ..Request::new(id, prompt_len, output_len, hashes)
        }
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
    /// Loading prompt KV from the external store, then the prefill chunks, then the decode
    /// step: the pass ends at `((start + load) + prefill) + decode`, added in that order.
    pub load_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// Prompt tokens the pass's prefill chunks computed, recomputation after a preemption
    /// included: the executed work AISimulate reports as `committed_prefill_tokens`, which
    /// the hits alone do not give once requests are preempted.
    pub prefill_tokens: u64,
    /// Requests admitted this pass with the prompt tokens their prefix hit covered.
    pub admitted: Vec<(RequestId, u32)>,
    /// Requests that emitted a token, and whether it was their last.
    pub emitted: Vec<(RequestId, bool)>,
    /// Finished requests whose KV the engine keeps for a handoff (see
    /// [`Engine::release_source`]).
    pub held: Vec<RequestId>,
    /// Requests that can never fit this engine.
    pub rejected: Vec<RequestId>,
    pub preempted: Vec<RequestId>,
    pub kv_events: Vec<KvEvent>,
}

impl PassOutput {
    /// Empties the output for the next pass, keeping its buffers: a simulation runs millions
    /// of passes, and allocating their lists afresh was a sixth of its time.
    pub fn clear(&mut self) {
        self.load_ms = 0.0;
        self.prefill_ms = 0.0;
        self.decode_ms = 0.0;
        self.prefill_tokens = 0;
        self.admitted.clear();
        self.emitted.clear();
        self.held.clear();
        self.rejected.clear();
        self.preempted.clear();
        self.kv_events.clear();
    }

    /// When a pass that started at `start_ms` ends.
    pub fn end_ms(&self, start_ms: f64) -> f64 {
        pass_end_ms(start_ms, self.load_ms, self.prefill_ms, self.decode_ms)
    }
}

/// Where the passes of one step may lie: what could change a worker's passes reaches it no
/// sooner than `starts_before`, and what reaches it mid-pass acts where that pass ends, in
/// the order of the passes that end together, so a step (ordered where it starts) must not
/// run past `ends_by` either.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepWindow {
    /// Every pass of the step starts before this.
    pub starts_before: f64,
    /// Every pass of the step ends by this.
    pub ends_by: f64,
}

impl StepWindow {
    /// Passes that start before `starts_before` and may end at any time: what reaches the
    /// worker then only queues there.
    pub fn before(starts_before: f64) -> StepWindow {
        StepWindow {
            starts_before,
            ends_by: f64::INFINITY,
        }
    }
}

/// Fills `ends` (emptied first) with when each of up to `passes` quiet passes from `start`
/// ends, `end_of(n, at)` timing the `n`th started at `at` (`None`: it is not quiet after
/// all), every pass within `window`.
pub(crate) fn quiet_ends(
    ends: &mut Vec<f64>,
    passes: u32,
    start: f64,
    window: StepWindow,
    mut end_of: impl FnMut(u64, f64) -> Option<f64>,
) {
    let StepWindow {
        starts_before: before,
        ends_by,
    } = window;
    ends.clear();
    let mut at = start;
    while (ends.len() as u32) < passes && at < before {
        let Some(end) = end_of(ends.len() as u64, at) else {
            break;
        };
        // A pass that takes no time ends where it starts: the event loop's to apply.
        if end <= at || end > ends_by {
            break;
        }
        ends.push(end);
        at = end;
    }
}

/// An engine whose quiet decode passes can run as one step ([`coast`], [`coast_ranks`]):
/// passes that change little but token counts, each timed as it would be on its own.
pub(crate) trait Coast {
    /// The plan of the quiet passes from a start.
    type Quiet;
    /// Holds no request in any state: queued, running, held for a handoff or promised room.
    fn is_drained(&self) -> bool;
    /// How many quiet passes may run from `start`, each starting before `before`; `None`
    /// when the next pass would not be quiet.
    fn quiet(&self, start: f64, before: f64) -> Option<Self::Quiet>;
    /// The most passes `quiet` allows.
    fn passes(quiet: &Self::Quiet) -> u32;
    /// When the `n`th quiet pass of the plan, started at `at`, ends on this engine; `None`
    /// where that pass is not quiet after all. Asked of passes in order: an engine may
    /// apply the passes before the `n`th here, to check the `n`th against their outcome.
    fn quiet_pass_end(&mut self, quiet: &mut Self::Quiet, n: u64, at: f64) -> Option<f64>;
    /// Applies the quiet passes of the plan that ended at `ends` (those not applied yet);
    /// `tokens(id, times)` hears each request's tokens.
    fn run_quiet(
        &mut self,
        quiet: Self::Quiet,
        ends: &[f64],
        tokens: &mut dyn FnMut(RequestId, &[f64]),
    );
    /// The buffer of the last step's pass ends, kept from step to step.
    fn coast_ends(&mut self) -> &mut Vec<f64>;
    /// How many passes from the next on are certain to end no request and reject none,
    /// each a decode pass of at least [`Coast::least_pass_ms`], where no request arrives: a
    /// lower bound, zero where the next pass may.
    fn passes_before_an_end(&self) -> u32;
    /// The least time a pass [`Coast::passes_before_an_end`] counts takes.
    fn least_pass_ms(&self) -> f64;
}

/// Past this many milliseconds of virtual time the spacing of `f64`s could eat
/// [`earliest_end`]'s margin: no lookahead there (about eleven days).
const LOOKAHEAD_MS: f64 = 1e9;

/// The earliest a request held by `engine` can end (finish, or be rejected) where its
/// next pass starts at `from` and no request arrives before: `from` plus the passes that
/// certainly end none, each at its least; infinite where it holds none. Each pass's time
/// is charged a nanosecond and a billionth less, for the rounding of the sums that time
/// the real passes.
fn earliest_end<E: Coast>(engine: &E, from: f64) -> f64 {
    if engine.is_drained() {
        return f64::INFINITY;
    }
    let step = engine.least_pass_ms() * (1.0 - 1e-9) - 1e-6;
    if !(from < LOOKAHEAD_MS && step > 0.0) {
        return from;
    }
    from + f64::from(engine.passes_before_an_end()) * step
}

/// Runs `engine`'s quiet passes from `start` as one step, each within `window`: the state
/// left and every token's time are the same as had the passes run one by one.
/// A long decode is mostly such passes, and each is a few additions per request: run one by
/// one through the event loop they were most of a simulation's time. Returns how many
/// passes ran and when the last ended; `None` when not even one qualifies.
pub(crate) fn coast<E: Coast>(
    engine: &mut E,
    start: f64,
    window: StepWindow,
    tokens: &mut dyn FnMut(RequestId, &[f64]),
) -> Option<(u64, f64)> {
    let mut quiet = engine.quiet(start, window.starts_before)?;
    let mut ends = std::mem::take(engine.coast_ends());
    let passes = E::passes(&quiet);
    quiet_ends(&mut ends, passes, start, window, |n, at| {
        engine.quiet_pass_end(&mut quiet, n, at)
    });
    engine.run_quiet(quiet, &ends, tokens);
    let step = Some(ends.len() as u64).zip(ends.last().copied());
    *engine.coast_ends() = ends;
    step
}

/// [`coast`] for the attention-DP ranks of one worker, whose passes start together and end
/// with the slowest: every rank that holds a request must be quiet, and a pass's end is the
/// latest of theirs.
pub(crate) fn coast_ranks<E: Coast>(
    ranks: &mut [&mut E],
    start: f64,
    window: StepWindow,
    tokens: &mut dyn FnMut(RequestId, &[f64]),
) -> Option<(u64, f64)> {
    let mut quiet = Vec::with_capacity(ranks.len());
    for (r, engine) in ranks.iter().enumerate() {
        if !engine.is_drained() {
            quiet.push((r, engine.quiet(start, window.starts_before)?));
        }
    }
    let passes = quiet.iter().map(|(_, q)| E::passes(q)).min()?;
    let mut ends = Vec::new();
    quiet_ends(&mut ends, passes, start, window, |n, at| {
        let mut end = at;
        for (r, q) in &mut quiet {
            end = end.max(ranks[*r].quiet_pass_end(q, n, at)?);
        }
        Some(end)
    });
    for (r, q) in quiet {
        ranks[r].run_quiet(q, &ends, tokens);
    }
    Some((ends.len() as u64, *ends.last()?))
}

/// When a pass that started at `start_ms` ends: its load, prefill and decode added in that
/// order, which the last bit of every later time depends on.
pub(crate) fn pass_end_ms(start_ms: f64, load_ms: f64, prefill_ms: f64, decode_ms: f64) -> f64 {
    ((start_ms + load_ms) + prefill_ms) + decode_ms
}

/// A handoff's destination side has room for the prompt's KV: the transfer may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub id: RequestId,
    /// Prompt tokens the decode worker lacked (its prefix cache held the rest).
    pub missing_tokens: u32,
}

/// Prompts waiting for room on a destination worker, in arrival order. Only the first is
/// tried, and only once per *capacity generation* (an engine bumps it whenever a request
/// ends, is preempted or releases its source), so a prompt that did not fit is not tried
/// again until room may have appeared.
pub(super) struct DestinationQueue<T> {
    waiting: VecDeque<(T, Option<u64>)>,
}

impl<T> Default for DestinationQueue<T> {
    fn default() -> Self {
        DestinationQueue {
            waiting: VecDeque::new(),
        }
    }
}

impl<T> DestinationQueue<T> {
    pub(super) fn push_back(&mut self, item: T) {
        self.waiting.push_back((item, None));
    }

    /// The first prompt, when it has not been tried at `generation` yet; marks it tried.
    pub(super) fn front_due(&mut self, generation: u64) -> Option<&mut T> {
        let (item, attempted) = self.waiting.front_mut()?;
        if *attempted == Some(generation) {
            return None;
        }
        *attempted = Some(generation);
        Some(item)
    }

    pub(super) fn pop_front(&mut self) -> Option<T> {
        self.waiting.pop_front().map(|(item, _)| item)
    }

    /// Puts back a first prompt that did not fit at `generation`.
    pub(super) fn push_front_tried(&mut self, item: T, generation: u64) {
        self.waiting.push_front((item, Some(generation)));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// One engine of a worker (a data-parallel rank).
pub enum Engine {
    Vllm(VllmEngine),
    Sglang(SglangEngine),
}

impl Engine {
    /// `track_events`: report block stores and removals for a KV-aware router.
    /// `prefill_only`: a disaggregated prefill worker, which holds finished requests' KV.
    pub fn new(args: EngineArgs, track_events: bool, prefill_only: bool) -> Engine {
        match args.engine_type {
            EngineType::Sglang => {
                Engine::Sglang(SglangEngine::new(args, track_events, prefill_only))
            }
            _ => Engine::Vllm(VllmEngine::new(args, track_events, prefill_only)),
        }
    }

    pub fn enqueue(&mut self, r: Request) {
        match self {
            Engine::Vllm(e) => e.enqueue(r),
            Engine::Sglang(e) => e.enqueue(r),
        }
    }

    /// Runs one pass; `None` when there is nothing to do. The external store, when given,
    /// serves the vLLM and TRT-LLM engines' admissions.
    pub fn pass(&mut self, connector: Option<&mut dyn KvConnector>) -> Option<PassOutput> {
        let mut out = PassOutput::default();
        self.pass_into(connector, &mut out).then_some(out)
    }

    /// [`Engine::pass`] into `out` (emptied first), reusing its buffers; whether anything
    /// happened.
    pub fn pass_into(
        &mut self,
        connector: Option<&mut dyn KvConnector>,
        out: &mut PassOutput,
    ) -> bool {
        match self {
            Engine::Vllm(e) => e.pass_into(connector, out),
            Engine::Sglang(e) => e.pass_into(out),
        }
    }

    /// Runs the passes from `start` that would change little but token counts as one step,
    /// each within `window` (which passes qualify: `VllmEngine::quiet`,
    /// `SglangEngine::quiet`).
    pub fn coast(
        &mut self,
        start: f64,
        window: StepWindow,
        tokens: &mut dyn FnMut(RequestId, &[f64]),
    ) -> Option<(u64, f64)> {
        match self {
            Engine::Vllm(e) => coast(e, start, window, tokens),
            Engine::Sglang(e) => coast(e, start, window, tokens),
        }
    }

    /// Sets the worker's pass count since it last held no request, before a pass (vLLM's
    /// prefill cadence on attention-DP ranks reads it).
    pub fn set_wave_step(&mut self, step: u64) {
        if let Engine::Vllm(e) = self {
            e.set_wave_step(step);
        }
    }

    /// Holds no request in any state: queued, running, held for a handoff or promised room.
    pub fn is_drained(&self) -> bool {
        match self {
            Engine::Vllm(e) => e.is_drained(),
            Engine::Sglang(e) => e.is_drained(),
        }
    }

    /// A worker's wave step (its passes since it last held no request, which AISimulate's
    /// vLLM prefill cadence counts) after its `ranks` changed: it starts over once none
    /// holds a request.
    pub fn settle_wave(ranks: &[Engine], wave_step: &mut u64) {
        if ranks.iter().all(Engine::is_drained) {
            *wave_step = 0;
        }
    }

    /// [`Engine::coast`] for the ranks of one worker, whose passes end with the slowest:
    /// one rank's own, or its attention-DP ranks together (the crate's `coast_ranks`).
    pub fn coast_ranks(
        ranks: &mut [Engine],
        start: f64,
        window: StepWindow,
        tokens: &mut dyn FnMut(RequestId, &[f64]),
    ) -> Option<(u64, f64)> {
        if let [engine] = ranks {
            return engine.coast(start, window, tokens);
        }
        // A worker's ranks are all of one engine type.
        let (mut vllm, mut sglang) = (Vec::new(), Vec::new());
        for engine in ranks {
            match engine {
                Engine::Vllm(e) => vllm.push(e),
                Engine::Sglang(e) => sglang.push(e),
            }
        }
        match (vllm.is_empty(), sglang.is_empty()) {
            (false, true) => coast_ranks(&mut vllm, start, window, tokens),
            (true, false) => coast_ranks(&mut sglang, start, window, tokens),
            _ => None,
        }
    }

    /// The earliest any of a worker's `ranks` can end a request (finish it, or reject it)
    /// where their next pass starts at `from` and none arrives before; infinite where they
    /// hold none. The ranks' passes start together, so each pass counts on every rank.
    pub fn earliest_end(ranks: &[Engine], from: f64) -> f64 {
        ranks
            .iter()
            .map(|engine| match engine {
                Engine::Vllm(e) => earliest_end(e, from),
                Engine::Sglang(e) => earliest_end(e, from),
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// No request to schedule (held sources and destinations not yet activated wait on the
    /// handoff, not on a pass).
    pub fn is_idle(&self) -> bool {
        match self {
            Engine::Vllm(e) => e.is_idle(),
            Engine::Sglang(e) => e.is_idle(),
        }
    }

    pub fn block_size(&self) -> u32 {
        match self {
            Engine::Vllm(e) => e.block_size(),
            Engine::Sglang(e) => e.block_size(),
        }
    }

    /// Blocks of a prompt this engine holds cached (the prefix a router could credit).
    pub fn cached_prefix_blocks(&self, hashes: &[u64]) -> usize {
        match self {
            Engine::Vllm(e) => e.cached_prefix_blocks(hashes),
            Engine::Sglang(e) => e.cached_prefix_blocks(hashes),
        }
    }

    /// A prefilled prompt's KV is on its way: queue it for room here and, when `now` (the
    /// worker is between passes), try at once. Returns the reservation that succeeded,
    /// which may be an earlier request's; `Err` when the prompt alone exceeds the pool.
    pub fn reserve_destination(
        &mut self,
        r: Request,
        now: bool,
    ) -> Result<Option<Reserved>, RequestId> {
        match self {
            Engine::Vllm(e) => e.reserve_destination(r, now),
            Engine::Sglang(e) => e.reserve_destination(r, now),
        }
    }

    /// Tries the first queued destination again if room may have appeared since.
    pub fn retry_destinations(&mut self) -> Option<Reserved> {
        match self {
            Engine::Vllm(e) => e.retry_destinations(),
            Engine::Sglang(e) => e.retry_destinations(),
        }
    }

    /// The transfer of a reserved prompt is complete: the request joins the queue with its
    /// prompt computed. The next destination may then fit; its reservation is returned.
    pub fn activate(&mut self, id: RequestId) -> Option<Reserved> {
        match self {
            Engine::Vllm(e) => e.activate(id),
            Engine::Sglang(e) => e.activate(id),
        }
    }

    /// The decode side has the KV of a held request: free it here.
    pub fn release_source(&mut self, id: RequestId) {
        match self {
            Engine::Vllm(e) => e.release_source(id),
            Engine::Sglang(e) => e.release_source(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{EngineVersion, SglangArgs, SglangPolicy};
    use std::collections::{BTreeMap, VecDeque};

    /// What [`token_times`] saw: every request's token times, the passes run as one step
    /// and the preemptions.
    #[derive(Default)]
    struct Seen {
        times: BTreeMap<RequestId, Vec<f64>>,
        coasted: u64,
        preempted: usize,
        /// The requests rejected, with when their pass started.
        rejected: Vec<(RequestId, f64)>,
    }

    /// Runs `engine` to the end with `arrivals` (time, request) reaching it as the event
    /// loop brings them: before the first pass that starts at or after their time. With
    /// `coast`, quiet passes before the next arrival run as one step.
    fn token_times(
        mut engine: Engine,
        mut arrivals: VecDeque<(f64, Request)>,
        coast: bool,
    ) -> Seen {
        let mut seen = Seen::default();
        let mut now = 0.0;
        let mut out = PassOutput::default();
        loop {
            while arrivals.front().is_some_and(|(t, _)| *t <= now) {
                engine.enqueue(arrivals.pop_front().expect("front").1);
            }
            let before = arrivals.front().map_or(f64::INFINITY, |(t, _)| *t);
            let times = &mut seen.times;
            let mut hear = |id, at: &[f64]| times.entry(id).or_default().extend_from_slice(at);
            let window = StepWindow::before(before);
            let stepped = coast.then(|| engine.coast(now, window, &mut hear));
            if let Some((passes, end)) = stepped.flatten() {
                seen.coasted += passes;
                now = end;
            } else if engine.pass_into(None, &mut out) {
                let end = out.end_ms(now);
                for &(id, _) in &out.emitted {
                    hear(id, &[end]);
                }
                seen.preempted += out.preempted.len();
                seen.rejected
                    .extend(out.rejected.iter().map(|&id| (id, now)));
                now = end;
            } else if let Some(&(t, _)) = arrivals.front() {
                now = t;
            } else {
                return seen;
            }
        }
    }

    /// The passes run as one step gave every request the token times, and the preemptions
    /// and rejections, the passes run one by one gave; with `requests`, more than 50 passes
    /// ran in steps and that many requests were served or rejected.
    fn assert_same_times(case: &str, one_by_one: &Seen, stepped: &Seen, requests: Option<usize>) {
        assert!(
            requests.is_none() || stepped.coasted > 50,
            "{case}: {} passes in steps",
            stepped.coasted
        );
        if let Some(requests) = requests {
            let ended = one_by_one.times.len() + one_by_one.rejected.len();
            assert_eq!(ended, requests, "{case}");
        }
        assert_eq!(one_by_one.preempted, stepped.preempted, "{case}");
        assert_eq!(one_by_one.rejected, stepped.rejected, "{case}");
        assert_eq!(one_by_one.times.len(), stepped.times.len(), "{case}");
        for (id, times) in &one_by_one.times {
            assert_eq!(Some(times), stepped.times.get(id), "{case}: request {id}");
        }
    }

    /// The hashes of the first `blocks` blocks of sequence `id`'s prompt and output: a
    /// later prompt that repeats them shares them.
    fn blocks_of(id: u32, blocks: u32) -> Arc<[u64]> {
        (0..blocks)
            .map(|b| u64::from(id) << 32 | u64::from(b))
            .collect()
    }

    /// [`token_times`] for a worker of several ranks, whose passes start together and end
    /// with the slowest; arrivals go to the ranks in turn. The worker's wave step counts
    /// its passes as the event loop's does (vLLM's prefill cadence reads it).
    fn worker_token_times(
        mut ranks: Vec<Engine>,
        mut arrivals: VecDeque<(f64, Request)>,
        coast: bool,
    ) -> Seen {
        let mut seen = Seen::default();
        let (mut now, mut next_rank, mut wave) = (0.0, 0, 0);
        let mut outs: Vec<PassOutput> = ranks.iter().map(|_| PassOutput::default()).collect();
        loop {
            while arrivals.front().is_some_and(|(t, _)| *t <= now) {
                let rank = next_rank % ranks.len();
                ranks[rank].enqueue(arrivals.pop_front().expect("front").1);
                next_rank += 1;
            }
            let before = arrivals.front().map_or(f64::INFINITY, |(t, _)| *t);
            let times = &mut seen.times;
            let mut hear = |id, at: &[f64]| times.entry(id).or_default().extend_from_slice(at);
            let window = StepWindow::before(before);
            let stepped = coast.then(|| Engine::coast_ranks(&mut ranks, now, window, &mut hear));
            if let Some((passes, end)) = stepped.flatten() {
                seen.coasted += passes;
                wave += passes;
                Engine::settle_wave(&ranks, &mut wave);
                now = end;
                continue;
            }
            let mut end: Option<f64> = None;
            for (engine, out) in ranks.iter_mut().zip(&mut outs) {
                engine.set_wave_step(wave);
                if !engine.is_idle() && engine.pass_into(None, out) {
                    end = Some(end.map_or(out.end_ms(now), |e: f64| e.max(out.end_ms(now))));
                    seen.preempted += out.preempted.len();
                    seen.rejected
                        .extend(out.rejected.iter().map(|&id| (id, now)));
                } else {
                    out.clear();
                }
            }
            if let Some(end) = end {
                for out in &outs {
                    for &(id, _) in &out.emitted {
                        hear(id, &[end]);
                    }
                }
                wave += 1;
                Engine::settle_wave(&ranks, &mut wave);
                now = end;
            } else if let Some(&(t, _)) = arrivals.front() {
                now = t;
            } else {
                return seen;
            }
        }
    }

    #[test]
    fn attention_dp_ranks_run_their_quiet_passes_as_one_step_too() {
        for (engine_type, block_size, num_gpu_blocks) in [
            (EngineType::Vllm, 16, 40),
            (EngineType::Vllm, 128, 400),
            (EngineType::Trtllm, 16, 60),
            (EngineType::Sglang, 16, 40),
            (EngineType::Sglang, 128, 400),
        ] {
            let args = EngineArgs {
                engine_type,
                block_size,
                num_gpu_blocks,
                engine_version: EngineVersion::Aisimulate013,
                dp_size: 3,
                ..EngineArgs::default()
            };
            let arrivals: VecDeque<(f64, Request)> = (0..30u32)
                .map(|id| {
                    let (prompt, output) = (20 + (id * 37) % 90, 1 + (id * 53) % 150);
                    let request = Request::new(id, prompt, output, Arc::from(Vec::new()));
                    (f64::from(id) * 61.5, request)
                })
                .collect();
            // A router that hears the pool's events keeps the steps between blocks; without
            // one they take and fill blocks too.
            for events in [true, false] {
                let case = format!("{engine_type:?}, blocks of {block_size}, events {events}");
                let ranks = || {
                    (0..3)
                        .map(|_| Engine::new(args.clone(), events, false))
                        .collect()
                };
                let one_by_one = worker_token_times(ranks(), arrivals.clone(), false);
                let stepped = worker_token_times(ranks(), arrivals.clone(), true);
                assert_same_times(&case, &one_by_one, &stepped, Some(30));
            }
        }
    }

    #[test]
    fn quiet_passes_run_as_one_step_give_the_times_passes_run_one_by_one_do() {
        // Both engines and both references' schedulers; small blocks (a boundary every few
        // passes) in a pool small enough to preempt or retract, and large ones (long quiet
        // stretches); shared prefixes, and arrivals in the middle of decodes; vLLM without
        // prefix caching too (a filled block gets its hash as its next token is emitted).
        let lpm = SglangArgs {
            schedule_policy: SglangPolicy::Lpm,
            ..SglangArgs::default()
        };
        let (dynamo, aisimulate) = (EngineVersion::Dynamo142, EngineVersion::Aisimulate013);
        let (vllm, sglang) = (EngineType::Vllm, EngineType::Sglang);
        let cases = [
            (vllm, dynamo, 16, 36, true),
            (vllm, aisimulate, 16, 36, true),
            (vllm, aisimulate, 16, 36, false),
            (vllm, dynamo, 128, 400, true),
            (sglang, dynamo, 16, 36, true),
            (sglang, aisimulate, 16, 36, true),
            (sglang, aisimulate, 128, 400, true),
        ];
        for (engine_type, version, block_size, num_gpu_blocks, prefix_caching) in cases {
            let args = EngineArgs {
                engine_type,
                block_size,
                num_gpu_blocks,
                engine_version: version,
                enable_prefix_caching: prefix_caching,
                sglang: lpm.clone(),
                ..EngineArgs::default()
            };
            let shared: Arc<[u64]> = Arc::from(vec![7u64, 8, 9]);
            let lengths = |id: u32| (20 + (id * 37) % 90, 1 + (id * 53) % 150);
            let arrivals: VecDeque<(f64, Request)> = (0..24u32)
                .map(|id| {
                    let (prompt, output) = lengths(id);
                    let request = match id % 3 {
                        0 => Request::new(id, prompt, output, shared.clone()),
                        // The next request's prompt repeats this one's and the start of its
                        // answer, as a conversation's next turn does, while this one still
                        // decodes: it finds the blocks the decode passes cached.
                        1 => {
                            let whole = blocks_of(id, (prompt + output) / block_size);
                            let own = (prompt / block_size) as usize;
                            Request::new(id, prompt, output, Arc::from(&whole[..own]))
                                .with_output_hashes(Arc::from(&whole[own..]))
                        }
                        _ => {
                            let (before, answer) = lengths(id - 1);
                            let prompt = before + answer.min(3 * block_size);
                            Request::new(id, prompt, output, blocks_of(id - 1, prompt / block_size))
                        }
                    };
                    (f64::from(id) * 97.5, request)
                })
                .collect();
            let mut coasted = Vec::new();
            for events in [true, false] {
                let case = format!(
                    "{engine_type:?} {version:?}, blocks of {block_size}, prefix caching \
                     {prefix_caching}, events {events}"
                );
                let engine = || Engine::new(args.clone(), events, false);
                let one_by_one = token_times(engine(), arrivals.clone(), false);
                let stepped = token_times(engine(), arrivals.clone(), true);
                assert_eq!(one_by_one.preempted > 0, num_gpu_blocks < 100, "{case}");
                assert_same_times(&case, &one_by_one, &stepped, Some(24));
                coasted.push(stepped.coasted);
            }
            // The steps go on through block and page boundaries where no router listens.
            assert!(
                coasted[1] > coasted[0],
                "{engine_type:?} {version:?}: {coasted:?}"
            );
        }
    }

    #[test]
    fn passes_that_refuse_the_head_of_the_queue_run_as_one_step_too() {
        // Under memory pressure most passes refuse the head of the queue and change nothing
        // else. Random workloads (a fixed seed) in pools of 450–1,000 tokens: the three engines
        // under both references' schedulers, one to three attention-DP ranks (vLLM's with
        // its prefill cadence), SGLang's `lpm` and FIFO, prefix caching on and off, prompts
        // past `max_model_len` arriving mid-decode, and conversations whose next turn
        // repeats the last answer while it is still being generated, with and without a
        // listening router.
        let mut next = 0x9E37_79B9_7F4A_7C15u64;
        let mut draw = |m: u32| {
            next ^= next << 13;
            next ^= next >> 7;
            next ^= next << 17;
            (next % u64::from(m)) as u32
        };
        let mut coasted = 0;
        for workload in 0..180 {
            let engine_type =
                [EngineType::Sglang, EngineType::Vllm, EngineType::Trtllm][draw(3) as usize];
            let sglang = engine_type == EngineType::Sglang;
            let version =
                [EngineVersion::Dynamo142, EngineVersion::Aisimulate013][draw(2) as usize];
            let page = [4, 16, 32][draw(3) as usize];
            let prefix_caching = version == EngineVersion::Dynamo142 && sglang || draw(3) > 0;
            // Attention-DP ranks, vLLM's with its prefill cadence.
            let dp_size = [1, 1, 2, 3][draw(4) as usize];
            let cadence = match engine_type {
                EngineType::Vllm if version == EngineVersion::Aisimulate013 => 1 + draw(3),
                _ => 1,
            };
            let args = EngineArgs {
                engine_type,
                dp_size,
                prefill_schedule_interval: cadence,
                block_size: page,
                num_gpu_blocks: u64::from((450 + draw(550)) / page),
                engine_version: version,
                enable_prefix_caching: prefix_caching,
                max_model_len: (version == EngineVersion::Aisimulate013 && draw(2) == 0)
                    .then_some(240),
                sglang: SglangArgs {
                    schedule_policy: [SglangPolicy::Lpm, SglangPolicy::Fifo][draw(2) as usize],
                    // The memory admission leaves grows pass by pass where the expected
                    // output it reserves shrinks faster than the pages the passes take.
                    schedule_conservativeness: [0.5, 1.0, 2.0][draw(3) as usize],
                    ..SglangArgs::default()
                },
                ..EngineArgs::default()
            };
            let mut at = 0.0;
            // The last conversation's first turn: its id, prompt and answer lengths.
            let mut conversation: Option<(u32, u32, u32)> = None;
            let mut arrivals = VecDeque::new();
            for id in 0..30u32 {
                let kind = draw(4);
                // A next turn comes while its first turn still generates its answer.
                at += f64::from(draw(if kind == 2 { 15 } else { 120 }));
                let (prompt, output) = (10 + draw(270), 1 + draw(400));
                let request = match (kind, conversation) {
                    // A shared system prompt.
                    (0, _) => Request::new(id, prompt, output, blocks_of(u32::MAX, prompt / page)),
                    // A conversation starts; a later turn repeats its answer's blocks.
                    (1, _) => {
                        conversation = Some((id, prompt, output));
                        let whole = blocks_of(id, (prompt + output) / page);
                        let own = (prompt / page) as usize;
                        Request::new(id, prompt, output, Arc::from(&whole[..own]))
                            .with_output_hashes(Arc::from(&whole[own..]))
                    }
                    // Its next turn: the first turn's prompt and the start of its answer,
                    // maybe while that is still being generated.
                    (2, Some((first, before, answer))) => {
                        let prompt = before + answer.min(2 * page) + draw(20);
                        Request::new(id, prompt, output, blocks_of(first, prompt / page))
                    }
                    _ => Request::new(id, prompt, output, Arc::from(Vec::new())),
                };
                arrivals.push_back((at, request));
            }
            for events in [true, false] {
                let case = format!("workload {workload}: {args:?}, events {events}");
                let ranks = || {
                    (0..dp_size)
                        .map(|_| Engine::new(args.clone(), events, false))
                        .collect()
                };
                let one_by_one = worker_token_times(ranks(), arrivals.clone(), false);
                let stepped = worker_token_times(ranks(), arrivals.clone(), true);
                assert_same_times(&case, &one_by_one, &stepped, None);
                coasted += stepped.coasted;
            }
        }
        assert!(coasted > 10_000, "{coasted} passes in steps");
    }
}
