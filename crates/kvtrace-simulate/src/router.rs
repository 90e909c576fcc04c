//! Routers that pick a worker (or a DP rank of one) for each request: `round_robin`, and
//! `kv_router`, which weighs each candidate's cached prefix (learned from the engines' KV
//! events after every pass) against the load the router itself has sent there. Ties are
//! broken by a seeded generator, so kvtrace's kv_router runs are reproducible.

use serde::Deserialize;
use serde_json::Value as Json;

use super::blocks::KvEvent;
use super::engine::RequestId;
use super::{BlockMap, BlockSet};
use crate::error::{json_reason, short};
use crate::rng::SplitMix64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueuePolicy {
    Fcfs,
    Lcfs,
    Wspt,
}

/// The kv_router's knobs, with the names and defaults of Dynamo's `KvRouterConfig`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvRouterConfig {
    pub overlap_score_credit: f64,
    pub overlap_score_credit_decay: f64,
    pub prefill_load_scale: f64,
    pub decode_active_request_weight: f64,
    pub router_temperature: f64,
    pub router_track_active_blocks: bool,
    pub router_assume_kv_reuse: bool,
    pub router_track_prefill_tokens: bool,
    /// Queueing is off unless set: a fraction of the token budget every candidate's pending
    /// prefill must exceed before requests wait in the router.
    pub router_queue_threshold: Option<f64>,
    pub router_queue_policy: QueuePolicy,
}

impl Default for KvRouterConfig {
    fn default() -> Self {
        KvRouterConfig {
            overlap_score_credit: 1.0,
            overlap_score_credit_decay: 0.0,
            prefill_load_scale: 1.0,
            decode_active_request_weight: 0.0,
            router_temperature: 0.0,
            router_track_active_blocks: true,
            router_assume_kv_reuse: true,
            router_track_prefill_tokens: true,
            router_queue_threshold: None,
            router_queue_policy: QueuePolicy::Fcfs,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct RawRouter {
    overlap_score_credit: Option<f64>,
    overlap_score_credit_decay: Option<f64>,
    prefill_load_scale: Option<f64>,
    decode_active_request_weight: Option<f64>,
    overlap_score_weight: Option<f64>,
    router_temperature: Option<f64>,
    router_track_active_blocks: Option<bool>,
    router_assume_kv_reuse: Option<bool>,
    router_track_prefill_tokens: Option<bool>,
    router_queue_threshold: Option<f64>,
    router_queue_policy: Option<String>,
    // Accepted; they configure live-cluster plumbing with no effect on a simulation.
    host_cache_hit_weight: Option<Json>,
    disk_cache_hit_weight: Option<Json>,
    use_kv_events: Option<Json>,
    router_replica_sync: Option<Json>,
    router_track_output_blocks: Option<Json>,
    router_tracking_hash: Option<Json>,
    router_tracking_key_file: Option<Json>,
    router_tracking_key_id: Option<Json>,
    router_prefill_load_model: Option<Json>,
    router_ttl_secs: Option<Json>,
    router_policy_config: Option<Json>,
    router_event_threads: Option<Json>,
    skip_initial_worker_wait: Option<Json>,
    use_remote_indexer: Option<Json>,
    serve_indexer: Option<Json>,
    shared_cache_multiplier: Option<Json>,
    shared_cache_type: Option<Json>,
    router_predicted_ttl_secs: Option<Json>,
    conditional_disagg_enabled: Option<Json>,
    conditional_disagg_policy: Option<Json>,
    conditional_disagg_eff_isl_threshold: Option<Json>,
    conditional_disagg_eff_isl_ratio_threshold: Option<Json>,
    conditional_disagg_prefill_busy_threshold: Option<Json>,
    conditional_disagg_decode_busy_threshold: Option<Json>,
    durable_kv_events: Option<Json>,
    router_snapshot_threshold: Option<Json>,
    router_reset_states: Option<Json>,
}

impl QueuePolicy {
    pub fn parse(name: &str) -> Result<QueuePolicy, String> {
        match name {
            "fcfs" => Ok(QueuePolicy::Fcfs),
            "lcfs" => Ok(QueuePolicy::Lcfs),
            "wspt" => Ok(QueuePolicy::Wspt),
            other => Err(format!(
                "router_queue_policy {other:?}: expected fcfs, lcfs or wspt"
            )),
        }
    }
}

impl KvRouterConfig {
    /// Parses `--router-config` JSON; errors are one line naming the field.
    pub fn from_json(text: &str) -> Result<KvRouterConfig, String> {
        let raw: RawRouter = serde_json::from_str(text).map_err(|e| json_reason(&e))?;
        let mut c = KvRouterConfig::default();
        if let Some(w) = raw.overlap_score_weight {
            c.prefill_load_scale = w;
            if w == 0.0 {
                c.overlap_score_credit = 0.0;
            }
        }
        let numbers = [
            (
                "overlap_score_credit",
                raw.overlap_score_credit,
                &mut c.overlap_score_credit,
            ),
            (
                "overlap_score_credit_decay",
                raw.overlap_score_credit_decay,
                &mut c.overlap_score_credit_decay,
            ),
            (
                "prefill_load_scale",
                raw.prefill_load_scale,
                &mut c.prefill_load_scale,
            ),
            (
                "decode_active_request_weight",
                raw.decode_active_request_weight,
                &mut c.decode_active_request_weight,
            ),
            (
                "router_temperature",
                raw.router_temperature,
                &mut c.router_temperature,
            ),
        ];
        for (name, value, slot) in numbers {
            if let Some(v) = value {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(format!(
                        "{name} {}: expected a non-negative number",
                        short(v)
                    ));
                }
                *slot = v;
            }
        }
        if let Some(v) = raw.router_track_active_blocks {
            c.router_track_active_blocks = v;
        }
        if let Some(v) = raw.router_assume_kv_reuse {
            c.router_assume_kv_reuse = v;
        }
        if let Some(v) = raw.router_track_prefill_tokens {
            c.router_track_prefill_tokens = v;
        }
        if let Some(t) = raw.router_queue_threshold {
            if !(t.is_finite() && t >= 0.0) {
                return Err(format!(
                    "router_queue_threshold {}: expected a number >= 0",
                    short(t)
                ));
            }
            c.router_queue_threshold = Some(t);
        }
        if let Some(p) = raw.router_queue_policy {
            c.router_queue_policy = QueuePolicy::parse(&p)?;
        }
        Ok(c)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum RouterMode {
    RoundRobin,
    KvRouter(KvRouterConfig),
}

/// The load the router has sent to one candidate and not yet seen finish.
#[derive(Default)]
struct Load {
    prefill_tokens: u64,
    /// Prompt blocks of in-flight requests, by hash, with how many requests hold each.
    blocks: BlockMap<u32>,
    /// Blocks counted once per request (partial tails, or all when reuse is not assumed).
    private_blocks: u64,
    requests: u64,
}

/// What the router remembers of a routed request.
struct Routed {
    candidate: usize,
    prefill_tokens: u64,
    hashes: std::sync::Arc<[u64]>,
    private_blocks: u64,
}

pub struct Router {
    mode: RouterMode,
    block_size: u32,
    /// The DP ranks of each worker: candidate `w · ranks + r` is rank `r` of worker `w`.
    ranks: usize,
    next: usize,
    rng: SplitMix64,
    loads: Vec<Load>,
    /// Each candidate's cached prompt blocks, as its KV events report them.
    index: Vec<BlockSet>,
    /// By request id.
    routed: Vec<Option<Routed>>,
}

/// A routing decision.
pub struct Route {
    pub candidate: usize,
    /// Prompt tokens the chosen candidate holds cached, per the router's index.
    pub overlap_tokens: u32,
}

impl Router {
    pub fn new(mode: RouterMode, candidates: usize, block_size: u32, seed: u64) -> Router {
        Router {
            mode,
            block_size: block_size.max(1),
            ranks: 1,
            next: 0,
            rng: SplitMix64::new(seed),
            loads: (0..candidates).map(|_| Load::default()).collect(),
            index: (0..candidates).map(|_| BlockSet::default()).collect(),
            routed: Vec::new(),
        }
    }

    /// The candidates are `ranks` DP ranks of each worker (see [`Router::route`]).
    pub fn with_ranks(mut self, ranks: usize) -> Router {
        self.ranks = ranks.max(1);
        self
    }

    /// How many requests go to other workers before worker `worker` gets one, where the
    /// router takes the workers in turn (round robin), whatever they hold; `None` where
    /// it reads them.
    pub fn turns_before(&self, worker: usize) -> Option<usize> {
        match self.mode {
            RouterMode::RoundRobin => {
                let workers = (self.loads.len() / self.ranks).max(1);
                Some((worker + workers - self.next % workers) % workers)
            }
            RouterMode::KvRouter(_) => None,
        }
    }

    pub fn mode(&self) -> &RouterMode {
        &self.mode
    }

    /// Whether the router wants KV events at all.
    pub fn uses_kv_events(&self) -> bool {
        matches!(self.mode, RouterMode::KvRouter(_))
    }

    fn overlap(&self, candidate: usize, hashes: &[u64]) -> usize {
        let set = &self.index[candidate];
        hashes.iter().take_while(|h| set.contains(h)).count()
    }

    /// True when a queueing kv_router should hold a request back: every candidate's pending
    /// prefill exceeds `threshold · budget` tokens.
    pub fn all_busy(&self, budget_tokens: u64) -> bool {
        match &self.mode {
            RouterMode::KvRouter(KvRouterConfig {
                router_queue_threshold: Some(t),
                ..
            }) => {
                let limit = t * budget_tokens as f64;
                self.loads.iter().all(|l| l.prefill_tokens as f64 > limit)
            }
            _ => false,
        }
    }

    /// The fewest uncached prompt tokens any candidate would compute (the WSPT weight).
    pub fn best_uncached_tokens(&self, hashes: &[u64], isl: u32) -> u64 {
        (0..self.loads.len())
            .map(|c| {
                u64::from(isl)
                    .saturating_sub((self.overlap(c, hashes) as u64) * u64::from(self.block_size))
            })
            .min()
            .unwrap_or(u64::from(isl))
    }

    /// Picks a candidate for a request and books its load there.
    pub fn route(&mut self, id: RequestId, hashes: std::sync::Arc<[u64]>, isl: u32) -> Route {
        let n = self.loads.len();
        let b = u64::from(self.block_size);
        let blocks = u64::from(isl).div_ceil(b);
        let tail = blocks - hashes.len() as u64;
        let (candidate, overlap) = match &self.mode {
            RouterMode::RoundRobin => {
                // Worker by worker, then the next rank of each, as Dynamo 1.4.2 cycles:
                // with two ranks, rank 0 of every worker before rank 1 of the first.
                let k = self.next % n;
                self.next = (self.next + 1) % n;
                let workers = (n / self.ranks).max(1);
                let c = (k % workers) * self.ranks + k / workers;
                (c, self.overlap(c, &hashes))
            }
            RouterMode::KvRouter(config) => {
                let overlaps: Vec<usize> = (0..n).map(|c| self.overlap(c, &hashes)).collect();
                let min_prefill = self
                    .loads
                    .iter()
                    .map(|l| l.prefill_tokens)
                    .min()
                    .unwrap_or(0);
                let logits: Vec<f64> = (0..n)
                    .map(|c| {
                        let load = &self.loads[c];
                        let overlap = overlaps[c] as f64;
                        let raw_prefill = if config.router_track_prefill_tokens {
                            (load.prefill_tokens + u64::from(isl)) as f64
                        } else {
                            0.0
                        };
                        let decay = if config.overlap_score_credit_decay > 0.0 && blocks > 0 {
                            let excess = (load.prefill_tokens - min_prefill) as f64 / b as f64;
                            1.0 / (1.0 + config.overlap_score_credit_decay * excess / blocks as f64)
                        } else {
                            1.0
                        };
                        let credit = config.overlap_score_credit * decay * overlap;
                        let decode_blocks = if config.router_track_active_blocks {
                            let (active, additional) = if config.router_assume_kv_reuse {
                                let new = hashes
                                    .iter()
                                    .filter(|h| !load.blocks.contains_key(h))
                                    .count();
                                (
                                    load.blocks.len() as u64 + load.private_blocks,
                                    new as u64 + tail,
                                )
                            } else {
                                (load.private_blocks, blocks)
                            };
                            (active + additional) as f64
                        } else {
                            0.0
                        };
                        config.prefill_load_scale * (raw_prefill / b as f64 - credit).max(0.0)
                            + decode_blocks
                            + config.decode_active_request_weight * load.requests as f64
                    })
                    .collect();
                let c = self.select(&logits, config.router_temperature);
                (c, overlaps[c])
            }
        };
        let overlap_tokens = ((overlap as u64) * b).min(u64::from(isl));
        let prefill_tokens = u64::from(isl) - overlap_tokens;
        let (assume_reuse, track_blocks) = match &self.mode {
            RouterMode::KvRouter(c) => (
                c.router_assume_kv_reuse,
                c.router_assume_kv_reuse && c.router_track_active_blocks,
            ),
            RouterMode::RoundRobin => (true, false),
        };
        let private_blocks = if assume_reuse { tail } else { blocks };
        let load = &mut self.loads[candidate];
        load.prefill_tokens += prefill_tokens;
        load.requests += 1;
        load.private_blocks += private_blocks;
        // The blocks by hash only weigh a kv_router's choice that tracks active blocks;
        // counting them for every request was a sixth of a round-robin simulation.
        if track_blocks {
            for h in hashes.iter() {
                *load.blocks.entry(*h).or_default() += 1;
            }
        }
        if self.routed.len() <= id as usize {
            self.routed.resize_with(id as usize + 1, || None);
        }
        self.routed[id as usize] = Some(Routed {
            candidate,
            prefill_tokens,
            hashes: if track_blocks {
                hashes
            } else {
                std::sync::Arc::from(Vec::new())
            },
            private_blocks,
        });
        Route {
            candidate,
            overlap_tokens: overlap_tokens as u32,
        }
    }

    /// Argmin with seeded uniform tie-breaking, or a softmax draw over min-max normalised
    /// logits when the temperature is positive.
    fn select(&mut self, logits: &[f64], temperature: f64) -> usize {
        let min = logits.iter().copied().fold(f64::INFINITY, f64::min);
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if temperature > 0.0 && max > min {
            let weights: Vec<f64> = logits
                .iter()
                .map(|l| (-(l - min) / ((max - min) * temperature)).exp())
                .collect();
            let mut draw = self.rng.next_f64() * weights.iter().sum::<f64>();
            for (i, w) in weights.iter().enumerate() {
                if draw < *w {
                    return i;
                }
                draw -= w;
            }
            return logits.len() - 1;
        }
        let mut chosen = 0;
        let mut ties = 0u64;
        for (i, &l) in logits.iter().enumerate() {
            if l == min {
                ties += 1;
                if self.rng.next_u64().is_multiple_of(ties) {
                    chosen = i;
                }
            }
        }
        chosen
    }

    /// The request emitted its first token: its prompt no longer loads the candidate.
    pub fn prefill_done(&mut self, id: RequestId) {
        if let Some(Some(r)) = self.routed.get_mut(id as usize) {
            let load = &mut self.loads[r.candidate];
            load.prefill_tokens -= r.prefill_tokens;
            r.prefill_tokens = 0;
        }
    }

    /// The request ended (completed or rejected).
    pub fn free(&mut self, id: RequestId) {
        let Some(r) = self.routed.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        let load = &mut self.loads[r.candidate];
        load.prefill_tokens -= r.prefill_tokens;
        load.requests -= 1;
        load.private_blocks -= r.private_blocks;
        for h in r.hashes.iter() {
            if let Some(n) = load.blocks.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    load.blocks.remove(h);
                }
            }
        }
    }

    /// Applies a candidate's KV events after its pass.
    pub fn observe(&mut self, candidate: usize, events: &[KvEvent]) {
        let set = &mut self.index[candidate];
        for e in events {
            match *e {
                KvEvent::Stored(h) => {
                    set.insert(h);
                }
                KvEvent::Removed(h) => {
                    set.remove(&h);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn round_robin_tells_each_worker_its_turn() {
        for (workers, ranks) in [(1, 1), (2, 1), (3, 2), (4, 3)] {
            let mut r =
                Router::new(RouterMode::RoundRobin, workers * ranks, 16, 7).with_ranks(ranks);
            let mut placed = Vec::new();
            let mut told = Vec::new();
            for id in 0..30 {
                told.push((0..workers).map(|w| r.turns_before(w)).collect::<Vec<_>>());
                placed.push(r.route(id, Arc::from(vec![1]), 16).candidate / ranks);
            }
            for (i, turns) in told.iter().enumerate().take(30 - workers) {
                for (w, turn) in turns.iter().enumerate() {
                    let gets = placed[i..].iter().position(|&p| p == w);
                    assert_eq!(*turn, gets, "{workers} × {ranks}, request {i}, worker {w}");
                }
            }
        }
        let kv = Router::new(RouterMode::KvRouter(KvRouterConfig::default()), 2, 16, 7);
        assert_eq!(kv.turns_before(0), None);
    }

    #[test]
    fn kv_router_prefers_the_cached_prefix_and_is_seeded() {
        let mut r = Router::new(RouterMode::KvRouter(KvRouterConfig::default()), 3, 16, 7);
        let hashes: Arc<[u64]> = Arc::from(vec![1, 2, 3, 4]);
        r.observe(
            2,
            &[KvEvent::Stored(1), KvEvent::Stored(2), KvEvent::Stored(3)],
        );
        let route = r.route(0, hashes.clone(), 64);
        assert_eq!((route.candidate, route.overlap_tokens), (2, 48));
        r.free(0);
        let picks = |seed| {
            let mut r = Router::new(RouterMode::KvRouter(KvRouterConfig::default()), 4, 16, seed);
            (0..20)
                .map(|i| r.route(i, Arc::from(vec![i as u64 + 100]), 16).candidate)
                .collect::<Vec<_>>()
        };
        assert_eq!(picks(1), picks(1), "same seed, same ties");
        assert!(
            picks(1)
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                > 1,
            "load spreads"
        );
    }

    #[test]
    fn router_config_fields_are_checked_by_name() {
        let c = KvRouterConfig::from_json(
            r#"{"overlap_score_weight": 0, "router_queue_policy": "wspt"}"#,
        )
        .expect("ok");
        assert_eq!((c.prefill_load_scale, c.overlap_score_credit), (0.0, 0.0));
        assert_eq!(c.router_queue_policy, QueuePolicy::Wspt);
        let e = KvRouterConfig::from_json(r#"{"router_temprature": 1}"#).expect_err("unknown");
        assert!(e.contains("router_temprature"), "{e}");
        let e = KvRouterConfig::from_json(r#"{"router_temperature": -1}"#).expect_err("neg");
        assert!(e.contains("router_temperature -1"), "{e}");
    }
}
