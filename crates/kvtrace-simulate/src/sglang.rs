//! The SGLang mock engine, step for step as the reference mocker runs it. Each pass admits
//! a batch of prefill chunks from the head of the queue, then runs one decode step over
//! every running request, prompts admitted this pass included:
//!
//! * **Admission** stops at the first request that does not fit: a prompt longer than the
//!   chunk size is cut at a page boundary to what the pass's chunk budget has left; the
//!   memory left — free and evictable tokens minus what running requests are still expected
//!   to generate (`new_token_ratio` of their remaining output, clipped) — must exceed the
//!   chunk rounded up to pages plus, when the prompt completes, its own clipped output. A
//!   chunked request goes back to the head of the queue with its complete pages cached.
//! * **`lpm`** orders the queue by the longest prefix the radix tree holds (plain FIFO while
//!   more than 128 wait), pushing back requests whose first 32 tokens repeat a waiting one.
//! * **Decode** grows each request by one token; when the pages it needs exceed free plus
//!   evictable memory it retracts the request with the fewest generated tokens (its KV
//!   released, its ratio reset), otherwise it evicts what it lacks. Every full page a request
//!   fills goes into the tree at once.
//! * **KV** lives in [`RadixCache`]: a request locks the path its cached pages end at; a
//!   finished one inserts its complete pages (freeing copies the tree already holds) and
//!   unlocks, leaving them evictable.
//!
//! The new-token ratio starts at 0.7 × `schedule_conservativeness`, decays by a 600th of the
//! way to 14 % of that each pass and resets when memory runs out.
//!
//! With [`EngineVersion::Aisimulate013`] the engine follows AISimulate 0.13's scheduler
//! instead, where it parts from Dynamo 1.4.2's: a pass that admits a prefill batch runs it
//! alone — the running requests wait, and the requests whose prompt it completed take their
//! first token from the prefill forward; a fresh request is matched once, up to its last
//! token, and charged only what it computes; a chunked request is admitted once; a retracted
//! request goes to the back of the queue and the ratio is re-estimated from the requests that
//! stay; the ratio decays on decode passes only.

use std::collections::VecDeque;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::args::{EngineArgs, EngineVersion, SglangPolicy, WorkerType};
use super::blocks::KvEvent;
use super::engine::{
    pass_end_ms, Coast, DestinationQueue, PassOutput, Request, RequestId, Reserved,
};
use super::perf;
use super::radix::{NodeId, PageId, PublishedPages, RadixCache};
use super::BlockSet;

/// Requests beyond this many waiting are served FIFO even under `lpm`.
const LPM_FALLBACK: usize = 128;
/// A request whose cached prefix is at most this long, and whose first tokens repeat
/// another waiting request's, goes behind the rest under `lpm`.
const IN_BATCH_PREFIX_TOKENS: u32 = 32;
const RATIO_DECAY_PASSES: f64 = 600.0;
/// Decode steps' worth of tokens AISimulate reserves per surviving request when it
/// re-estimates the new-token ratio at a retraction.
const RETRACT_DECODE_STEPS: f64 = 20.0;

/// The KV a request holds: its pages in sequence order (the cached prefix's come from the
/// tree), how many tokens they hold, how many of those are in the tree, and the node that
/// prefix ends at (locked while the lease lives).
#[derive(Default)]
struct Lease {
    pages: Vec<PageId>,
    tokens: u32,
    cached: u32,
    node: Option<NodeId>,
}

struct Req {
    id: RequestId,
    prompt_len: u32,
    output_len: u32,
    generated: u32,
    /// Hashes of the sequence's full pages, as far as they were asked for: the prompt's
    /// `prompt_pages`, then the pages generated tokens fill (which nobody shares unless
    /// `output_keys` says what a later prompt repeats). One list, so that a match or an
    /// insert borrows it instead of copying the two halves together.
    keys: Vec<u64>,
    prompt_pages: usize,
    output_keys: Arc<[u64]>,
    lease: Lease,
    /// Tokens whose KV is computed, and tokens of page room allocated.
    materialized: u32,
    allocated: u32,
}

impl Req {
    fn len(&self) -> u32 {
        self.prompt_len + self.generated
    }

    fn remaining_output(&self) -> u32 {
        self.output_len.saturating_sub(self.generated)
    }
}

/// Room set aside for a transferred prompt: the prefix the tree held (locked at `node`)
/// and fresh pages for the rest.
struct Destination {
    prefix_tokens: u32,
    prefix_pages: Vec<PageId>,
    node: NodeId,
    fresh: Vec<PageId>,
    allocated: u32,
}

pub struct SglangEngine {
    args: EngineArgs,
    /// AISimulate 0.13's scheduler where it parts from Dynamo 1.4.2's (see
    /// [`EngineVersion::Aisimulate013`] and the module docs).
    aisimulate: bool,
    /// Prompts share the tree's pages: `enable_prefix_caching`, which only AISimulate's
    /// SGLang scheduler honours (Dynamo 1.4.2's caches regardless).
    prefix_caching: bool,
    page: u32,
    max_running: usize,
    cache: RadixCache,
    published: Option<PublishedPages>,
    events: Vec<KvEvent>,
    waiting: VecDeque<Req>,
    /// The tree's generation `waiting` was put in `lpm` order for, while neither changed
    /// since: ordering it again would give the same order, so it is skipped (under memory
    /// pressure most passes change neither, and scoring every waiting request was most of
    /// the simulation).
    ordered_for: Option<u64>,
    /// Transferred prompts activated here, admitted ahead of everything else.
    prebuilt: VecDeque<Req>,
    running: Vec<Req>,
    new_token_ratio: f64,
    ratio_init: f64,
    ratio_min: f64,
    ratio_step: f64,
    prefill_only: bool,
    sources: Vec<Req>,
    destinations: DestinationQueue<Req>,
    reserved: Vec<(Req, Destination)>,
    capacity_generation: u64,
    next_unique: u64,
    /// When each pass of the last quiet step ended ([`Coast::coast_ends`]).
    coast_ends: Vec<f64>,
}

/// The quiet passes an engine may run as one step (see [`Coast`]): at most
/// `passes`, each decoding `batch` requests that hold `context` tokens before the first.
pub(crate) struct Quiet {
    passes: u32,
    batch: u64,
    context: u64,
    /// The passes whose pages are taken and cached already.
    applied: u32,
    /// The first pass from `applied` on that takes, grows or caches a page: the passes
    /// before it only count tokens.
    next_page: u32,
    /// Where requests wait: the head of the queue, which each pass must still refuse.
    blocked: Option<Blocked>,
}

/// What the head of the queue asks of the memory left, and the new-token ratio a pass
/// reserves the running requests' output at.
struct Blocked {
    /// The head's chunk rounded up to pages plus its output reserve, which the memory left
    /// must exceed; `None` where it is refused whatever the memory (no slot for it, a
    /// budget it exceeds, nothing to compute).
    need: Option<f64>,
    /// The tree's generation the need and the queue's order were read at.
    generation: u64,
    /// The new-token ratio at the start of pass `next`, the next pass to be checked.
    ratio: f64,
    next: u64,
}

/// The order `lpm` sorts the queue in by its scores ([`SglangEngine::lpm_scores`]): the
/// longest prefix first, the requests whose first tokens repeat an earlier one's behind the
/// rest.
fn lpm_order(a: &(usize, bool), b: &(usize, bool)) -> std::cmp::Ordering {
    a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0))
}

/// How much of a waiting request a pass would take: from token `start` (what is computed
/// or matched), `chunk` tokens, charged as `charged` tokens of pages plus an `output_reserve`.
struct Chunk {
    start: u32,
    chunk: u32,
    charged: f64,
    output_reserve: u64,
}

impl Coast for SglangEngine {
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
    /// context; `None` when the next pass would not be quiet. A quiet pass changes little
    /// but token counts and the new-token ratio: no request is admitted, retracted or
    /// finishes, and none takes, fills or caches a page, except as below.
    ///
    /// Where no router hears the tree's stores and removals, a quiet pass may take pages
    /// (evicting as a pass would) and cache the pages it completes: both only change this
    /// tree, in an order the step keeps. Each pass is then checked against the passes
    /// before it ([`Coast::quiet_pass_end`]): the step stops before one that would retract.
    ///
    /// Requests may wait, as they do under memory pressure for most passes, where the head
    /// of the queue is refused pass after pass without a trace: it was tried before (its
    /// keys are those an admission reads), no prompt waits to be rejected, and the queue is
    /// in the order a pass would put it in (`lpm`'s, for the tree as it is). Each pass
    /// checks the refusal as admission would, and the order again where the tree changed.
    ///
    /// Prompts of a handoff may hold reserved pages (taken, their prefix locked); their
    /// activation waits on a transfer, which ends a step. A prompt still waiting for room,
    /// or activated and not yet admitted, is a pass's business: none may. So is what a
    /// reservation evicted, which the next pass's output publishes to the router.
    fn quiet(&self, start: f64, before: f64) -> Option<Quiet> {
        let quiet = !self.prefill_only
            && self.prebuilt.is_empty()
            && self.destinations.is_empty()
            && self.events.is_empty()
            && !self.running.is_empty()
            && start < before;
        if !quiet {
            return None;
        }
        let page = self.page;
        let fills = self.published.is_none();
        let mut passes = u32::MAX;
        let mut context = 0u64;
        for req in &self.running {
            // The first token has effects beyond the engine (the router's prefill load).
            if req.generated == 0 || req.lease.node.is_none() || req.allocated < req.len() {
                return None;
            }
            if !fills {
                let into_page = req.lease.tokens % page;
                // The pass that starts a page takes one; the one that completes a page
                // caches it.
                let to_new_page = if into_page == 0 { 0 } else { page - into_page };
                let to_cached_page = (req.lease.cached + page - 1).saturating_sub(req.materialized);
                let to_growth = req.allocated - req.len();
                passes = passes.min(to_new_page).min(to_cached_page).min(to_growth);
            }
            let to_last_token = req.output_len.saturating_sub(req.generated + 1);
            passes = passes.min(to_last_token);
            context += u64::from(req.len());
        }
        if passes == 0 {
            return None;
        }
        let blocked = match self.waiting.front() {
            None => None,
            Some(head) => {
                let need = self.head_need(head)?;
                let ratio = self.new_token_ratio;
                // The first pass admits it (checked before the queue's order, which costs
                // a match of every waiting prompt).
                if need.is_some_and(|need| need < self.memory_left(0, ratio)) {
                    return None;
                }
                let sorted =
                    self.ordered_for == Some(self.cache.generation()) || self.in_lpm_order();
                if self.sorts_waiting() && !sorted {
                    return None;
                }
                Some(Blocked {
                    need,
                    generation: self.cache.generation(),
                    ratio,
                    next: 0,
                })
            }
        };
        Some(Quiet {
            passes,
            batch: self.running.len() as u64,
            context,
            applied: 0,
            next_page: self.next_page_pass(0),
            blocked,
        })
    }

    /// Where nothing waits and every running request decodes, the passes before the first
    /// request's last token, as far as the free and evictable pages give each request its
    /// tokens and a page more: no pass before then admits, retracts or ends a request.
    /// (`quiet`'s count is an upper bound, checked pass by pass as a step applies them.)
    fn passes_before_an_end(&self) -> u32 {
        let still = self.prefill_only
            || !self.prebuilt.is_empty()
            || !self.destinations.is_empty()
            || !self.reserved.is_empty()
            || !self.waiting.is_empty()
            || self.running.is_empty();
        if still {
            return 0;
        }
        let mut passes = u32::MAX;
        for req in &self.running {
            if req.generated == 0 || req.lease.node.is_none() || req.allocated < req.len() {
                return 0;
            }
            passes = passes.min(req.output_len.saturating_sub(req.generated + 1));
        }
        let room = self.cache.available_tokens() + self.cache.evictable;
        let each = room / self.running.len() as u64;
        let fed = each.saturating_sub(u64::from(self.page));
        passes.min(u32::try_from(fed).unwrap_or(u32::MAX))
    }

    fn least_pass_ms(&self) -> f64 {
        self.args.least_decode_pass_ms()
    }

    /// Timed as [`SglangEngine::pass_into`] times a decode pass; `None` where the pass
    /// would admit the head of the queue, or retract. The passes before it are applied
    /// first, so that it is checked against the pages they took, cached and evicted.
    fn quiet_pass_end(&mut self, quiet: &mut Quiet, n: u64, at: f64) -> Option<f64> {
        let n = n as u32;
        self.apply_quiet(quiet, n);
        // A pass retracts where the free and evictable pages cannot give its pages.
        if n == quiet.next_page {
            let room = self.cache.available_tokens() + self.cache.evictable;
            if room < u64::from(self.pages_grown_at(n) * self.page) {
                return None;
            }
        }
        if let Some(blocked) = quiet.blocked.as_mut() {
            while blocked.next < u64::from(n) {
                blocked.ratio = self.decayed(blocked.ratio);
                blocked.next += 1;
            }
            let generation = self.cache.generation();
            if generation != blocked.generation {
                // The pages cached or evicted may have moved the queue's order, or what
                // its head finds in the tree.
                if self.sorts_waiting() && !self.in_lpm_order() {
                    return None;
                }
                // What `head_need` checks besides stands through the step: the queue and
                // the running requests' count are as they were.
                let head = self.waiting.front().expect("requests wait");
                blocked.need = self.admission_need(head);
                blocked.generation = generation;
            }
            // Admission refuses the head where its need reaches the memory left.
            if blocked
                .need
                .is_some_and(|need| need < self.memory_left(n, blocked.ratio))
            {
                return None;
            }
        }
        let context = quiet.context + quiet.batch * u64::from(n);
        Some(pass_end_ms(
            at,
            0.0,
            0.0,
            self.decode_step_ms(quiet.batch, context),
        ))
    }

    /// Applies quiet passes that ended at `ends`: every running request gains a token each,
    /// each pass's pages are taken and cached in the order a pass takes and caches them, and
    /// the new-token ratio decays once a pass.
    fn run_quiet(
        &mut self,
        mut quiet: Quiet,
        ends: &[f64],
        tokens: &mut dyn FnMut(RequestId, &[f64]),
    ) {
        let ran = ends.len() as u32;
        self.apply_quiet(&mut quiet, ran);
        for req in &mut self.running {
            req.lease.tokens += ran;
            req.generated += ran;
            req.materialized += ran;
            tokens(req.id, ends);
        }
        for _ in 0..ran {
            self.decay_ratio();
        }
    }
}

impl SglangEngine {
    pub fn new(args: EngineArgs, track_events: bool, prefill_only: bool) -> SglangEngine {
        let page = args.block_size.max(1);
        let ratio_init = 0.7 * args.sglang.schedule_conservativeness;
        let ratio_min = ratio_init * 0.14;
        let prefix_caching =
            args.enable_prefix_caching || args.engine_version == EngineVersion::Dynamo142;
        SglangEngine {
            aisimulate: args.engine_version == EngineVersion::Aisimulate013,
            prefix_caching,
            page,
            max_running: args.max_num_seqs.map_or(usize::MAX, |m| m as usize),
            cache: RadixCache::new(args.num_gpu_blocks.saturating_mul(u64::from(page)), page),
            // Without prefix caching nothing enters the tree, so the router hears of nothing.
            published: (track_events && prefix_caching).then(PublishedPages::default),
            events: Vec::new(),
            waiting: VecDeque::new(),
            ordered_for: None,
            prebuilt: VecDeque::new(),
            running: Vec::new(),
            new_token_ratio: ratio_init,
            ratio_init,
            ratio_min,
            ratio_step: (ratio_init - ratio_min) / RATIO_DECAY_PASSES,
            prefill_only,
            sources: Vec::new(),
            destinations: DestinationQueue::default(),
            reserved: Vec::new(),
            capacity_generation: 0,
            next_unique: 0,
            coast_ends: Vec::new(),
            args,
        }
    }

    /// A new request, its output cut to what `max_model_len` leaves after its prompt, where
    /// AISimulate's SGLang scheduler stops generating (a prompt at or past the limit is
    /// rejected by the next pass: [`SglangEngine::reject_too_long`]).
    fn request(&self, r: Request) -> Req {
        let output_len = self
            .args
            .output_within_model_len(r.prompt_len, r.output_len);
        Req {
            id: r.id,
            prompt_len: r.prompt_len,
            output_len,
            generated: 0,
            prompt_pages: r.hashes.len(),
            keys: r.hashes.to_vec(),
            output_keys: r.output_hashes,
            lease: Lease::default(),
            materialized: 0,
            allocated: 0,
        }
    }

    pub fn enqueue(&mut self, r: Request) {
        let req = self.request(r);
        self.waiting.push_back(req);
        self.ordered_for = None;
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.prebuilt.is_empty() && self.running.is_empty()
    }

    pub fn block_size(&self) -> u32 {
        self.page
    }

    /// Pages of a prompt the tree holds (the prefix a router could credit).
    pub fn cached_prefix_blocks(&self, hashes: &[u64]) -> usize {
        self.cache.prefix_match_len(hashes)
    }

    fn ceil_page(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.page) * self.page
    }

    /// The pages of `keys` the tree holds, touched, and the node where they end: none
    /// without prefix caching, when requests share nothing.
    fn match_prefix(&mut self, keys: &[u64]) -> (usize, NodeId) {
        if self.prefix_caching {
            self.cache.match_prefix(keys)
        } else {
            (0, self.cache.root())
        }
    }

    /// Makes `req.keys` hold the hashes of (at least) the first `pages` full pages of its
    /// sequence.
    fn extend_keys(next_unique: &mut u64, req: &mut Req, pages: usize) {
        while req.keys.len() < pages {
            let key = match req.output_keys.get(req.keys.len() - req.prompt_pages) {
                Some(&k) => k,
                None => {
                    *next_unique += 1;
                    xxh3_64_with_seed(&next_unique.to_le_bytes(), 0x5617A9)
                }
            };
            req.keys.push(key);
        }
    }

    fn free_pages(&mut self, pages: &[PageId]) {
        if pages.is_empty() {
            return;
        }
        self.cache.pool.free(pages);
        self.withdraw(pages);
    }

    fn withdraw(&mut self, pages: &[PageId]) {
        if let Some(published) = self.published.as_mut() {
            for &p in pages {
                if let Some(hash) = published.remove(p) {
                    self.events.push(KvEvent::Removed(hash));
                }
            }
        }
    }

    fn evict(&mut self, tokens: u64) {
        let freed = self.cache.evict(tokens);
        self.withdraw(&freed);
    }

    /// Announces the complete pages of `pages` from `from` tokens on that the router has
    /// not seen.
    fn publish(&mut self, keys: &[u64], pages: &[PageId], from: u32) {
        let Some(published) = self.published.as_mut() else {
            return;
        };
        let first = (from / self.page) as usize;
        for (&key, &page) in keys.iter().zip(pages).skip(first) {
            if published.store(page, key) {
                self.events.push(KvEvent::Stored(key));
            }
        }
    }

    /// Takes KV for the first `end` tokens of a fresh request: the prefix the tree holds
    /// (matched no further than `cap` tokens), then new pages (evicting if free ones fall
    /// short). Returns the prefix's tokens.
    fn allocate_fresh(&mut self, req: &mut Req, end: u32, cap: u32) -> Option<u32> {
        let full = (end / self.page) as usize;
        Self::extend_keys(&mut self.next_unique, req, full);
        let keys = &req.keys[..full];
        let matchable = (cap.min(end) / self.page) as usize;
        let (matched, node) = self.match_prefix(&keys[..matchable]);
        let prefix = matched as u32 * self.page;
        let required = u64::from(self.ceil_page(end - prefix));
        let fresh = self.lock_and_allocate(node, required)?;
        let mut pages = self.cache.path_pages(node);
        pages.extend(fresh);
        self.publish(keys, &pages, prefix);
        req.lease = Lease {
            pages,
            tokens: end,
            cached: prefix,
            node: Some(node),
        };
        Some(prefix)
    }

    /// Locks the matched prefix at `node` and takes fresh pages for `tokens` (a whole number
    /// of pages), evicting unlocked leaves if free pages fall short; `None`, with the lock
    /// released, when even eviction cannot make the room.
    fn lock_and_allocate(&mut self, node: NodeId, tokens: u64) -> Option<Vec<PageId>> {
        self.cache.lock(node);
        if tokens > self.cache.available_tokens() + self.cache.evictable {
            self.cache.unlock(node);
            return None;
        }
        let available = self.cache.available_tokens();
        if tokens > available {
            self.evict(tokens - available);
        }
        let fresh = self
            .cache
            .pool
            .allocate((tokens / u64::from(self.page)) as u32);
        if fresh.is_none() {
            self.cache.unlock(node);
        }
        fresh
    }

    /// Grows a request's KV to `end` tokens: the last page's free slots, then new pages.
    fn extend_allocation(&mut self, req: &mut Req, end: u32) -> bool {
        let have = req.lease.tokens;
        let in_last = if have.is_multiple_of(self.page) {
            0
        } else {
            self.page - have % self.page
        };
        let pages = (end - have).saturating_sub(in_last).div_ceil(self.page);
        let Some(fresh) = self.cache.pool.allocate(pages) else {
            return false;
        };
        req.lease.pages.extend(fresh);
        req.lease.tokens = end;
        let full = (end / self.page) as usize;
        Self::extend_keys(&mut self.next_unique, req, full);
        let keys = &req.keys[..full];
        self.publish(keys, &req.lease.pages, have);
        true
    }

    /// Puts the request's complete computed pages into the tree, moving its lock to where
    /// they end; pages the tree already held replace the request's copies, which are freed.
    fn cache_computed(&mut self, req: &mut Req) {
        let aligned = req.materialized / self.page * self.page;
        if aligned == 0 || aligned <= req.lease.cached || !self.prefix_caching {
            return;
        }
        let node = req.lease.node.expect("a computed request holds KV");
        let full = (aligned / self.page) as usize;
        Self::extend_keys(&mut self.next_unique, req, full);
        let keys = &req.keys[..full];
        let from = (req.lease.cached / self.page) as usize;
        self.publish(keys, &req.lease.pages, req.lease.cached);
        let end = self
            .cache
            .insert_from(node, from, keys, &req.lease.pages[..full]);
        if end != node {
            self.cache.lock(end);
        }
        let duplicates = self.reconcile(&mut req.lease.pages, end, from, full, true);
        self.free_pages(&duplicates);
        if end != node {
            self.cache.unlock(node);
        }
        req.lease.node = Some(end);
        req.lease.cached = aligned;
    }

    /// Walks the tree path ending at `end` back over pages `from..to` of `pages`: where the
    /// tree holds a different page, the request's copy is returned (to be freed) and, when
    /// `adopt`, replaced by the tree's.
    fn reconcile(
        &self,
        pages: &mut [PageId],
        end: NodeId,
        from: usize,
        to: usize,
        adopt: bool,
    ) -> Vec<PageId> {
        let mut duplicates = Vec::new();
        let mut at = end;
        let mut path_end = to;
        while path_end > from && at != self.cache.root() {
            let (node_pages, parent) = self.cache.node_pages(at);
            let path_start = path_end - node_pages.len();
            for p in path_start.max(from)..path_end {
                let canonical = node_pages[p - path_start];
                if pages[p] != canonical {
                    duplicates.push(pages[p]);
                    if adopt {
                        pages[p] = canonical;
                    }
                }
            }
            path_end = path_start;
            at = parent.unwrap_or(self.cache.root());
        }
        duplicates
    }

    /// A finished request leaves its complete pages in the tree (unlocked) and frees the rest
    /// (all of them without prefix caching).
    fn finish(&mut self, req: &mut Req) {
        let Some(node) = req.lease.node.take() else {
            return;
        };
        if !self.prefix_caching {
            let pages = std::mem::take(&mut req.lease.pages);
            self.free_pages(&pages);
            self.cache.unlock(node);
            return;
        }
        let complete = (req.len() / self.page * self.page).min(req.lease.tokens);
        let complete = complete / self.page * self.page;
        let full = (complete / self.page) as usize;
        let tail = req.lease.pages.split_off(full.min(req.lease.pages.len()));
        self.free_pages(&tail);
        if complete == 0 {
            self.cache.unlock(node);
            return;
        }
        Self::extend_keys(&mut self.next_unique, req, full);
        let keys = &req.keys[..full];
        let from = (req.lease.cached / self.page) as usize;
        self.publish(keys, &req.lease.pages, req.lease.cached);
        let end = self
            .cache
            .insert_from(node, from, keys, &req.lease.pages[..full]);
        let mut pages = std::mem::take(&mut req.lease.pages);
        let duplicates = self.reconcile(&mut pages, end, from, full, false);
        self.free_pages(&duplicates);
        self.cache.unlock(node);
    }

    /// Gives up a running request's KV: the pages beyond its cached prefix are freed and
    /// its lock released. Whether that may have made room.
    fn release_lease(&mut self, req: &mut Req) -> bool {
        let Some(node) = req.lease.node.take() else {
            return false;
        };
        let owned = req
            .lease
            .pages
            .split_off(((req.lease.cached / self.page) as usize).min(req.lease.pages.len()));
        let improved = !owned.is_empty() || node != self.cache.root();
        self.free_pages(&owned);
        self.cache.unlock(node);
        req.lease = Lease::default();
        improved
    }

    /// Rejects every waiting request whose prompt is `max_model_len` tokens or longer,
    /// wherever it waits, as AISimulate's SGLang scheduler does before each pass; the others
    /// keep their order.
    fn reject_too_long(&mut self, out: &mut PassOutput) {
        let before = self.waiting.len();
        let args = &self.args;
        self.waiting.retain(|r| {
            let refused = args.refuses_prompt(r.prompt_len);
            if refused {
                out.rejected.push(r.id);
            }
            !refused
        });
        if self.waiting.len() < before {
            self.ordered_for = None;
        }
    }

    fn order_waiting(&mut self) {
        if !self.sorts_waiting() || self.ordered_for == Some(self.cache.generation()) {
            return;
        }
        for req in &mut self.waiting {
            let full = (req.len() / self.page) as usize;
            Self::extend_keys(&mut self.next_unique, req, full);
        }
        let scores = self
            .lpm_scores()
            .expect("every waiting request's keys are read");
        let mut scored: Vec<((usize, bool), Req)> =
            scores.into_iter().zip(self.waiting.drain(..)).collect();
        scored.sort_by(|a, b| lpm_order(&a.0, &b.0));
        self.waiting.extend(scored.into_iter().map(|(_, r)| r));
        self.ordered_for = Some(self.cache.generation());
    }

    /// Whether a pass puts the queue in `lpm` order.
    fn sorts_waiting(&self) -> bool {
        self.args.sglang.schedule_policy == SglangPolicy::Lpm
            && self.prefix_caching
            && self.waiting.len() <= LPM_FALLBACK
    }

    /// `lpm`'s score of each waiting request, in queue order: the tokens of its prefix the
    /// tree holds, and whether its first tokens repeat an earlier request's (a request whose
    /// prefix is that short goes behind the rest); `None` where a request's keys are not all
    /// made yet.
    fn lpm_scores(&self) -> Option<Vec<(usize, bool)>> {
        let duplicate_len = IN_BATCH_PREFIX_TOKENS.div_ceil(self.page) * self.page;
        let duplicate_pages = (duplicate_len / self.page) as usize;
        let mut seen = BlockSet::default();
        let mut scores = Vec::with_capacity(self.waiting.len());
        for req in &self.waiting {
            let full = (req.len() / self.page) as usize;
            let keys = req.keys.get(..full)?;
            let prefix = self.cache.prefix_match_len(keys) * self.page as usize;
            let repeated = prefix <= IN_BATCH_PREFIX_TOKENS as usize
                && req.len() >= duplicate_len
                && !seen.insert(keys[duplicate_pages - 1]);
            scores.push((prefix, repeated));
        }
        Some(scores)
    }

    /// Whether the queue is in the order `lpm` would sort it in for this tree, so that the
    /// sort would leave it as it is.
    fn in_lpm_order(&self) -> bool {
        self.lpm_scores().is_some_and(|scores| {
            scores
                .windows(2)
                .all(|w| lpm_order(&w[0], &w[1]) != std::cmp::Ordering::Greater)
        })
    }

    /// Admits prefill chunks from the head of the queue; see the module docs.
    fn admit(&mut self, out: &mut PassOutput) -> (Vec<Req>, u64, u64, bool) {
        let s = &self.args.sglang;
        let mut rem_total = self.memory_left(0, self.new_token_ratio);
        let mut rem_input = s.max_prefill_tokens as f64;
        let mut rem_chunk = s.chunked_prefill_size as f64;
        let slots = self.max_running.saturating_sub(self.running.len());
        let (mut can_run, mut isl, mut prefix_total, mut oom) = (Vec::new(), 0, 0, false);
        let mut rejected = None;
        while can_run.len() < slots {
            let Some(mut req) = self.waiting.pop_front() else {
                break;
            };
            let first = req.materialized == 0;
            if self.aisimulate && first {
                let matchable = self.matchable(&req);
                Self::extend_keys(&mut self.next_unique, &mut req, matchable);
            }
            let Some(Chunk {
                start,
                chunk,
                charged,
                output_reserve,
            }) = self.chunk_of(&req, rem_chunk)
            else {
                rejected = Some(req);
                break;
            };
            if charged + output_reserve as f64 >= rem_total
                || charged > rem_input
                || charged > rem_chunk
            {
                rejected = Some(req);
                break;
            }
            let end = start + chunk;
            let before_alloc = req.allocated;
            let prefix = if !first {
                let need = u64::from(self.ceil_page(end).saturating_sub(before_alloc));
                let available = self.cache.available_tokens();
                let fits = !self.aisimulate || need <= available + self.cache.evictable;
                if fits && available < need {
                    self.evict(need - available);
                }
                (fits && self.extend_allocation(&mut req, end)).then_some(req.materialized)
            } else {
                let cap = if self.aisimulate { start } else { end };
                self.allocate_fresh(&mut req, end, cap)
            };
            let Some(prefix) = prefix else {
                rejected = Some(req);
                oom = true;
                break;
            };
            req.materialized = end;
            req.allocated = self.ceil_page(end);
            // AISimulate admits a request once; a later chunk continues that admission.
            if first || !self.aisimulate {
                out.admitted.push((req.id, prefix));
            }
            isl += u64::from(end);
            prefix_total += u64::from(prefix);
            rem_total -= if self.aisimulate {
                charged
            } else {
                f64::from(req.allocated - before_alloc)
            } + output_reserve as f64;
            rem_input -= charged;
            rem_chunk -= charged;
            can_run.push(req);
            if rem_chunk <= 0.0 {
                break;
            }
        }
        if let Some(req) = rejected {
            self.waiting.push_front(req);
        }
        (can_run, isl, prefix_total, oom)
    }

    /// The pages of a fresh request AISimulate matches against the tree: all but the one
    /// holding its last token, which is always computed.
    fn matchable(&self, req: &Req) -> usize {
        (req.len().saturating_sub(1) / self.page) as usize
    }

    /// What a pass would take of waiting request `req` with `rem_chunk` tokens of its chunk
    /// budget left; `None` where it takes nothing (all of it computed, or no page of budget).
    /// AISimulate matches a fresh request against the tree once, up to its last token, and
    /// neither charges nor recomputes what it found; Dynamo 1.4.2 charges the whole prompt
    /// and matches at allocation.
    fn chunk_of(&self, req: &Req, rem_chunk: f64) -> Option<Chunk> {
        let s = &self.args.sglang;
        let start = if self.aisimulate && req.materialized == 0 {
            let matchable = self.matchable(req);
            self.cache.prefix_match_len(&req.keys[..matchable]) as u32 * self.page
        } else {
            req.materialized
        };
        let extend = req.len() - start;
        if extend == 0 {
            return None;
        }
        let whole = if self.aisimulate {
            f64::from(self.ceil_page(extend)) <= rem_chunk
        } else {
            u64::from(extend) <= s.chunked_prefill_size
        };
        let chunk = if whole {
            extend
        } else {
            let c = (rem_chunk as u64 / u64::from(self.page) * u64::from(self.page)) as u32;
            if c == 0 {
                return None;
            }
            c.min(extend)
        };
        let output_reserve = if chunk < extend {
            0
        } else {
            u64::from(req.remaining_output()).min(s.clip_max_new_tokens)
        };
        Some(Chunk {
            start,
            chunk,
            charged: f64::from(self.ceil_page(chunk)),
            output_reserve,
        })
    }

    /// The memory admission may give, in tokens: the free and evictable tokens less what
    /// the running requests are expected to generate, `n` passes on (each of them a token
    /// nearer its end) at new-token ratio `ratio`, each request's part clipped.
    fn memory_left(&self, n: u32, ratio: f64) -> f64 {
        let clip = self.args.sglang.clip_max_new_tokens;
        let reserved: f64 = self
            .running
            .iter()
            .map(|r| {
                u64::from(r.output_len.saturating_sub(r.generated + n)).min(clip) as f64 * ratio
            })
            .sum();
        (self.cache.available_tokens() + self.cache.evictable) as f64 - reserved
    }

    /// [`SglangEngine::admission_need`] of the head of the queue, the next passes'
    /// condition for being quiet; `None` where a pass might do more than refuse it (see
    /// [`Coast::quiet`]): a prompt waits to be rejected, or the head, which admission
    /// would look at, was never tried (its keys are not made).
    fn head_need(&self, head: &Req) -> Option<Option<f64>> {
        let refused = |r: &Req| self.args.refuses_prompt(r.prompt_len);
        if self.args.max_model_len.is_some() && self.waiting.iter().any(refused) {
            return None;
        }
        let untried = self.aisimulate && head.materialized == 0;
        if untried
            && self.running.len() < self.max_running
            && head.keys.len() < self.matchable(head)
        {
            return None;
        }
        Some(self.admission_need(head))
    }

    /// What waiting request `head` needs of the memory left (its chunk's pages and output
    /// reserve) for admission to refuse it; `None` where admission refuses it whatever the
    /// memory (no slot for it, a budget it exceeds, nothing to compute).
    fn admission_need(&self, head: &Req) -> Option<f64> {
        if self.running.len() >= self.max_running {
            return None;
        }
        let s = &self.args.sglang;
        let rem_chunk = s.chunked_prefill_size as f64;
        let chunk = self.chunk_of(head, rem_chunk)?;
        if chunk.charged > s.max_prefill_tokens as f64 || chunk.charged > rem_chunk {
            return None;
        }
        Some(chunk.charged + chunk.output_reserve as f64)
    }

    /// The running requests whose page room quiet pass `k` of a step grows by a page (their
    /// token counts standing at the step's start).
    fn pages_grown_at(&self, k: u32) -> u32 {
        self.running
            .iter()
            .filter(|r| r.len() + k >= r.allocated)
            .count() as u32
    }

    /// Page room the running requests need to grow by one token each.
    fn growth_needed(&self) -> u64 {
        self.running
            .iter()
            .map(|r| {
                let burst = r.remaining_output().min(1);
                u64::from(self.ceil_page(r.len() + burst).saturating_sub(r.allocated))
            })
            .sum()
    }

    /// Evicts what the free pages lack for the running requests' next token.
    fn evict_for_growth(&mut self) {
        let available = self.cache.available_tokens();
        let need = self.growth_needed();
        if available < need {
            self.evict(need - available);
        }
    }

    /// Retracts the running request with the fewest generated tokens while free plus
    /// evictable memory cannot hold the next token of every request; then evicts what the
    /// free pages lack.
    fn check_decode_memory(&mut self) -> Vec<Req> {
        let mut retracted = Vec::new();
        loop {
            let room = self.cache.available_tokens() + self.cache.evictable;
            if room >= self.growth_needed() || self.running.len() <= 1 {
                break;
            }
            let Some(victim) = (0..self.running.len()).min_by_key(|&i| self.running[i].generated)
            else {
                break;
            };
            let mut req = self.running.remove(victim);
            self.release_lease(&mut req);
            req.materialized = 0;
            req.allocated = 0;
            retracted.push(req);
        }
        self.evict_for_growth();
        retracted
    }

    /// One decode step over the running requests; returns its milliseconds and the requests
    /// it retracted.
    fn decode(&mut self, out: &mut PassOutput) -> (f64, Vec<Req>) {
        if self.running.is_empty() {
            return (0.0, Vec::new());
        }
        let retracted = self.check_decode_memory();
        if self.running.is_empty() {
            return (0.0, retracted);
        }
        if self.aisimulate && !retracted.is_empty() {
            self.new_token_ratio = self.retraction_ratio();
        }
        let context: u64 = self.running.iter().map(|r| u64::from(r.len())).sum();
        let decode_ms = self.decode_step_ms(self.running.len() as u64, context);
        if !self.step(out) {
            return (0.0, retracted);
        }
        (decode_ms, retracted)
    }

    /// A decode step's milliseconds for `batch` requests holding `context` tokens in all (at
    /// most the pool's), quantized as the reference engine carries them.
    fn decode_step_ms(&self, batch: u64, context: u64) -> f64 {
        let total_kv = self.cache.total_tokens();
        let ms = perf::decode_ms(batch, context.min(total_kv), total_kv);
        perf::quantized(ms, self.args.decode_divisor())
    }

    /// AISimulate's `new_token_ratio` after a retraction, from the requests that stay:
    /// (tokens generated + 20 per request) over (tokens to generate + 1), at most 1.
    fn retraction_ratio(&self) -> f64 {
        let generated: u64 = self.running.iter().map(|r| u64::from(r.generated)).sum();
        let planned: u64 = self.running.iter().map(|r| u64::from(r.output_len)).sum();
        let estimate = (generated as f64 + RETRACT_DECODE_STEPS * self.running.len() as f64)
            / (planned as f64 + 1.0);
        estimate.min(1.0)
    }

    /// Gives each running request its next token, in a page reserved for the step, and
    /// caches the pages they complete; finished requests leave. `false` when the pages could
    /// not be reserved (nothing changed).
    fn step(&mut self, out: &mut PassOutput) -> bool {
        let pages = (self.growth_needed() / u64::from(self.page)) as u32;
        let Some(mut reservation) = self.cache.pool.allocate(pages) else {
            return false;
        };
        reservation.reverse();
        let mut running = std::mem::take(&mut self.running);
        let mut done = Vec::new();
        for (i, req) in running.iter_mut().enumerate() {
            self.take_token(req, &mut reservation);
            let complete = req.generated >= req.output_len;
            out.emitted.push((req.id, complete));
            if complete {
                done.push(i);
                continue;
            }
            self.cache_computed(req);
        }
        reservation.reverse();
        self.cache.pool.free(&reservation);
        let mut finished = Vec::with_capacity(done.len());
        for &i in done.iter().rev() {
            finished.push(running.remove(i));
        }
        finished.reverse();
        self.running = running;
        self.complete(finished, out);
        true
    }

    /// Gives `req` its next token: a page from the step's `reservation` (reversed) where
    /// the token starts one, and a page more of room where the token after it needs one.
    fn take_token(&self, req: &mut Req, reservation: &mut Vec<PageId>) {
        if req.lease.tokens.is_multiple_of(self.page) {
            req.lease
                .pages
                .push(reservation.pop().expect("the step's pages are reserved"));
        }
        req.lease.tokens += 1;
        if req.len() + 1 > req.allocated {
            req.allocated += self.page;
        }
        req.generated += 1;
        req.materialized += 1;
    }

    /// Applies the page work of a step's quiet passes up to (not including) pass `to`.
    fn apply_quiet(&mut self, quiet: &mut Quiet, to: u32) {
        while quiet.applied < to {
            if quiet.applied == quiet.next_page {
                self.page_pass(quiet.applied);
                quiet.next_page = self.next_page_pass(quiet.applied + 1);
            }
            quiet.applied += 1;
        }
    }

    /// The first quiet pass from pass `from` of a step on (the running requests' token
    /// counts standing at the step's start) whose token takes a page, needs a page more of
    /// room, or completes a page to cache.
    fn next_page_pass(&self, from: u32) -> u32 {
        let page = self.page;
        let first = |r: &Req| {
            let grows = (r.allocated - r.len()).max(from);
            let takes = from + (page - (r.lease.tokens + from) % page) % page;
            let completes = match self.prefix_caching {
                true => (r.lease.cached + page - 1)
                    .saturating_sub(r.materialized)
                    .max(from),
                false => u32::MAX,
            };
            grows.min(takes).min(completes)
        };
        self.running.iter().map(first).min().unwrap_or(u32::MAX)
    }

    /// The page work of quiet pass `k` of a step ([`Coast::quiet`]), as
    /// [`SglangEngine::decode`] does it: the pages the free ones lack evicted, the pass's
    /// pages reserved at once and, in running order, taken and the completed ones cached
    /// (the tree's clock, the free list's order and the keys made for generated pages all
    /// follow that order). The running requests' token counts stand at the step's start
    /// until [`Coast::run_quiet`] adds the passes; here a request's are moved to pass `k`
    /// while its pages are taken, then put back.
    fn page_pass(&mut self, k: u32) {
        let page = self.page;
        let growth = self.pages_grown_at(k);
        let mut running = std::mem::take(&mut self.running);
        let (available, need) = (self.cache.available_tokens(), u64::from(growth * page));
        if available < need {
            self.evict(need - available);
        }
        let mut reservation = self
            .cache
            .pool
            .allocate(growth)
            .expect("a quiet pass's pages were counted in the room");
        reservation.reverse();
        for req in &mut running {
            let (tokens, generated, materialized) =
                (req.lease.tokens, req.generated, req.materialized);
            let takes = (tokens + k).is_multiple_of(page);
            let grows = req.len() + k >= req.allocated;
            let completes =
                self.prefix_caching && (materialized + k + 1) / page * page > req.lease.cached;
            if !(takes || grows || completes) {
                continue;
            }
            req.lease.tokens = tokens + k;
            req.generated = generated + k;
            req.materialized = materialized + k;
            self.take_token(req, &mut reservation);
            self.cache_computed(req);
            req.lease.tokens = tokens;
            req.generated = generated;
            req.materialized = materialized;
        }
        reservation.reverse();
        self.cache.pool.free(&reservation);
        self.running = running;
    }

    /// AISimulate's prefill pass gives the requests whose prompt it completed their first
    /// token out of the prefill forward itself, without a decode step: one whose first token
    /// is its last finishes without a KV slot; the others take one (evicting cached pages if
    /// free ones fall short, never retracting), or wait for the next decode step when even
    /// that cannot make room. The requests already running sit the pass out.
    fn first_tokens(&mut self, out: &mut PassOutput) {
        let mut at = 0;
        let mut finished = Vec::new();
        while at < self.running.len() {
            if self.running[at].remaining_output() == 1 {
                let mut req = self.running.remove(at);
                req.generated += 1;
                out.emitted.push((req.id, true));
                finished.push(req);
            } else {
                at += 1;
            }
        }
        self.evict_for_growth();
        self.step(out);
        self.complete(finished, out);
    }

    /// Finished requests free their KV into the tree — or, on a prefill-only engine, keep
    /// it for the handoff.
    fn complete(&mut self, finished: Vec<Req>, out: &mut PassOutput) {
        for mut req in finished {
            if self.prefill_only {
                out.held.push(req.id);
                self.sources.push(req);
            } else {
                self.finish(&mut req);
                self.capacity_generation += 1;
            }
        }
    }

    /// Queues a transferred prompt for room here; see [`super::engine::Engine`].
    pub fn reserve_destination(
        &mut self,
        r: Request,
        now: bool,
    ) -> Result<Option<Reserved>, RequestId> {
        // A prompt the pool cannot hold, or at or past `max_model_len`, is refused here, as
        // AISimulate's destination refuses it.
        if u64::from(self.ceil_page(r.prompt_len)) > self.cache.total_tokens()
            || self.args.refuses_prompt(r.prompt_len)
        {
            return Err(r.id);
        }
        let req = self.request(r);
        self.destinations.push_back(req);
        Ok(if now { self.retry_destinations() } else { None })
    }

    /// Tries the first waiting destination once more if room may have appeared: the
    /// prefix the tree holds is locked, fresh pages cover the rest of the prompt.
    pub fn retry_destinations(&mut self) -> Option<Reserved> {
        let generation = self.capacity_generation;
        self.destinations.front_due(generation)?;
        let mut req = self.destinations.pop_front().expect("front");
        let Some(destination) = self.reserve_room(&mut req) else {
            self.destinations.push_front_tried(req, generation);
            return None;
        };
        let reserved = Reserved {
            id: req.id,
            missing_tokens: destination.fresh.len() as u32 * self.page,
        };
        self.reserved.push((req, destination));
        Some(reserved)
    }

    fn reserve_room(&mut self, req: &mut Req) -> Option<Destination> {
        let full = (req.prompt_len / self.page) as usize;
        Self::extend_keys(&mut self.next_unique, req, full);
        let keys = &req.keys[..full];
        let (matched, node) = self.match_prefix(keys);
        let prefix_tokens = matched as u32 * self.page;
        let mut prefix_pages = self.cache.path_pages(node);
        prefix_pages.truncate(matched);
        let allocated = self.ceil_page(req.prompt_len);
        let fresh_tokens = u64::from(allocated.saturating_sub(prefix_tokens));
        let fresh = self.lock_and_allocate(node, fresh_tokens)?;
        Some(Destination {
            prefix_tokens,
            prefix_pages,
            node,
            fresh,
            allocated,
        })
    }

    /// The transfer is complete: the request takes its pages, caches its complete prompt
    /// pages and is admitted first at the next pass. The next destination may then fit.
    pub fn activate(&mut self, id: RequestId) -> Option<Reserved> {
        let at = self.reserved.iter().position(|(r, _)| r.id == id)?;
        let (mut req, d) = self.reserved.remove(at);
        let available_before = self.cache.available_tokens();
        let mut pages = d.prefix_pages;
        pages.extend(d.fresh);
        req.lease = Lease {
            pages,
            tokens: req.prompt_len,
            cached: d.prefix_tokens,
            node: Some(d.node),
        };
        req.materialized = req.prompt_len;
        self.cache_computed(&mut req);
        req.allocated = d.allocated;
        self.prebuilt.push_back(req);
        if self.cache.available_tokens() > available_before {
            self.capacity_generation += 1;
        }
        self.retry_destinations()
    }

    /// The decode side has the KV of a held request: free it into the tree.
    pub fn release_source(&mut self, id: RequestId) {
        if let Some(at) = self.sources.iter().position(|r| r.id == id) {
            let mut req = self.sources.remove(at);
            self.finish(&mut req);
            self.capacity_generation += 1;
        }
    }

    fn decay_ratio(&mut self) {
        self.new_token_ratio = self.decayed(self.new_token_ratio);
    }

    /// The new-token ratio a pass leaves of `ratio`.
    fn decayed(&self, ratio: f64) -> f64 {
        (ratio - self.ratio_step).max(self.ratio_min)
    }

    /// Runs one pass into `out` (emptied first, its buffers kept); `false` when nothing
    /// could happen.
    pub fn pass_into(&mut self, out: &mut PassOutput) -> bool {
        out.clear();
        while self.running.len() < self.max_running {
            let Some(req) = self.prebuilt.pop_front() else {
                break;
            };
            out.admitted.push((req.id, 0));
            self.running.push(req);
        }
        self.reject_too_long(out);
        self.order_waiting();
        let (can_run, isl, prefix, oom) =
            if self.prebuilt.is_empty() && self.destinations.is_empty() {
                self.admit(out)
            } else {
                (Vec::new(), 0, 0, false)
            };
        let batch = can_run.len() as u64;
        let prefill_ms = if batch == 0 || self.args.worker_type == WorkerType::Decode {
            0.0
        } else {
            perf::quantized(
                perf::prefill_ms(batch, isl / batch, prefix / batch),
                self.args.speedup_ratio,
            )
        };
        let previously_running = self.running.len();
        if batch > 0 {
            self.ordered_for = None;
        }
        for mut req in can_run {
            if req.materialized < req.len() {
                self.cache_computed(&mut req);
                self.waiting.push_front(req);
            } else {
                self.running.push(req);
            }
        }
        // AISimulate runs a pass that formed a prefill batch as that batch alone.
        let prefill_pass = self.aisimulate && batch > 0;
        let (decode_ms, retracted) = if prefill_pass {
            let mut stalled: Vec<Req> = self.running.drain(..previously_running).collect();
            self.first_tokens(out);
            stalled.append(&mut self.running);
            self.running = stalled;
            (0.0, Vec::new())
        } else {
            self.decode(out)
        };
        let retracted_any = !retracted.is_empty();
        if retracted_any {
            self.ordered_for = None;
        }
        if self.aisimulate {
            // Behind the requests that have not run yet; the ratio was re-estimated at the
            // retraction and decays on decode passes only.
            for req in retracted {
                out.preempted.push(req.id);
                self.waiting.push_back(req);
            }
            if retracted_any {
                self.capacity_generation += 1;
            } else if !prefill_pass {
                self.decay_ratio();
            }
        } else {
            if oom {
                self.new_token_ratio = self.ratio_init;
            }
            for req in retracted.into_iter().rev() {
                out.preempted.push(req.id);
                self.waiting.push_front(req);
            }
            if retracted_any {
                self.new_token_ratio = self.ratio_init;
                self.capacity_generation += 1;
            }
            self.decay_ratio();
        }
        out.prefill_ms = prefill_ms;
        out.prefill_tokens = isl - prefix;
        out.decode_ms = decode_ms;
        out.kv_events.append(&mut self.events);
        !(batch == 0
            && out.rejected.is_empty()
            && out.admitted.is_empty()
            && out.emitted.is_empty()
            && out.preempted.is_empty()
            && out.kv_events.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::EngineType;

    #[test]
    fn what_a_reservation_evicted_is_published_by_a_pass_before_any_step() {
        // A decode worker under a KV-aware router: a finished request leaves its prompt
        // pages in the tree; a handoff's reservation then evicts some, between passes.
        // The worker was quiet before it, and a reserved prompt alone leaves it quiet: the
        // removals, which the next pass's output publishes, are what a step must wait for.
        let args = EngineArgs {
            engine_type: EngineType::Sglang,
            block_size: 16,
            num_gpu_blocks: 8,
            worker_type: WorkerType::Decode,
            ..EngineArgs::default()
        };
        let mut engine = SglangEngine::new(args, true, false);
        let hashes = |first: u64, n: u64| -> Arc<[u64]> { (first..first + n).collect() };
        let hand_over = |engine: &mut SglangEngine, r: Request| {
            let id = r.id;
            engine
                .reserve_destination(r, true)
                .expect("fits")
                .expect("room");
            engine.activate(id);
        };
        hand_over(&mut engine, Request::prefilled(0, 64, 1, hashes(1, 4)));
        hand_over(&mut engine, Request::prefilled(1, 32, 40, hashes(10, 2)));
        let mut out = PassOutput::default();
        let mut quiet_within = |engine: &mut SglangEngine, most: u32| {
            for _ in 0..most {
                if engine.quiet(0.0, f64::INFINITY).is_some() {
                    return true;
                }
                assert!(engine.pass_into(&mut out), "a pass");
            }
            false
        };
        assert!(quiet_within(&mut engine, 40), "quiet once both decode");
        let r = engine.reserve_destination(Request::prefilled(2, 64, 5, hashes(20, 4)), true);
        assert!(
            matches!(r, Ok(Some(_))),
            "room for the prompt, made by evicting"
        );
        assert!(engine.quiet(0.0, f64::INFINITY).is_none());
        let mut out = PassOutput::default();
        assert!(engine.pass_into(&mut out), "a pass");
        assert!(out
            .kv_events
            .iter()
            .any(|e| matches!(e, KvEvent::Removed(_))));
        assert!(
            quiet_within(&mut engine, 16),
            "quiet again beside the reserved prompt"
        );
        assert_eq!(engine.reserved.len(), 1);
    }
}
