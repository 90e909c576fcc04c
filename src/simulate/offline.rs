//! The offline simulation: a virtual clock that jumps from event to event (a pass ends, a
//! request arrives), so an hour of serving takes well under a second. At each instant it
//! applies finished passes, releases arrivals to the router, then starts a pass on every
//! idle worker that has work. Same-time events apply in the order they were scheduled, so a
//! run is a pure function of workload, configuration and seed.
//!
//! Disaggregated serving adds a prefill pool in front: a request's prompt runs there (with
//! one hidden output token and no decode cost), its KV moves to a decode worker after the
//! transfer delay, and the decode worker generates every visible token.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::args::EngineArgs;
use super::collector::{Collector, Provision, Status};
use super::engine::{Engine, KvConnector, PassOutput, RequestId, Sequence};
use super::live::{Done, LiveWorker};
use super::offload::Offload;
use super::router::{KvRouterConfig, QueuePolicy, Router, RouterMode};
use super::workload::Workload;

/// A pool of prefill workers in front of the decode workers.
#[derive(Clone, Debug)]
pub struct PrefillPool {
    pub engine: EngineArgs,
    pub workers: u32,
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The engines that generate tokens (aggregated, or the decode pool).
    pub engine: EngineArgs,
    pub workers: u32,
    /// Disaggregated serving: prompts run here first.
    pub prefill: Option<PrefillPool>,
    /// Routes to the entry pool; the decode pool of a disaggregated run gets a load-only
    /// variant of it.
    pub router: RouterMode,
    /// Closed loop: at most this many requests (single-turn) or sessions in flight.
    pub concurrency: Option<u32>,
    /// Seeds the router's tie-breaking.
    pub seed: u64,
    /// Live workers on threads and the wall clock instead of the virtual clock.
    pub online: bool,
}

pub struct SimResult {
    pub collector: Collector,
    pub provision: Provision,
    /// Real milliseconds the simulation took.
    pub wall_ms: f64,
    pub passes: u64,
}

/// A point on the virtual clock, ordered totally.
#[derive(Clone, Copy, PartialEq)]
struct Time(f64);

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

struct Worker {
    /// The engines, unless a live worker thread owns them.
    ranks: Vec<Engine>,
    live: Option<LiveWorker>,
    pending: Vec<(usize, PassOutput)>,
    busy: bool,
}

/// Workers of one kind and the router that places requests on them.
struct Pool {
    workers: Vec<Worker>,
    router: Router,
    dp: usize,
    block_size: u32,
    budget: u64,
    /// Prompts run here and move on to the decode pool.
    prefill_only: bool,
}

impl Pool {
    fn new(
        args: &EngineArgs,
        workers: u32,
        router: RouterMode,
        seed: u64,
        prefill_only: bool,
    ) -> Pool {
        let dp = args.dp_size.max(1) as usize;
        let router = Router::new(router, workers.max(1) as usize * dp, args.block_size, seed);
        let track = router.uses_kv_events();
        Pool {
            workers: (0..workers.max(1))
                .map(|_| Worker {
                    ranks: (0..dp)
                        .map(|_| Engine::new(args.clone(), track, prefill_only))
                        .collect(),
                    live: None,
                    pending: Vec::new(),
                    busy: false,
                })
                .collect(),
            router,
            dp,
            block_size: args.block_size,
            budget: args.max_num_batched_tokens.unwrap_or(u64::MAX),
            prefill_only,
        }
    }
}

/// The pools of a run, entry first.
const ENTRY: usize = 0;

/// A request waiting in the router's queue: higher `(strict, score)` goes first.
struct Queued {
    strict: u64,
    score: f64,
    order: u64,
    id: RequestId,
    sequence: Sequence,
}

struct Simulation<'a> {
    workload: &'a Workload,
    config: &'a SimConfig,
    collector: Collector,
    /// The entry pool (aggregated, or prefill), then the decode pool when disaggregated.
    pools: Vec<Pool>,
    /// Turns that fall due: `(time, session)`. Turns due together go in session order, as
    /// Dynamo's workload driver releases them (a session has one turn due at a time).
    arrivals: BinaryHeap<Reverse<(Time, u32)>>,
    /// Pass ends: `(time, order, pool, worker)`.
    completions: BinaryHeap<Reverse<(Time, u64, u8, u32)>>,
    /// KV transfers to the decode pool that complete: `(time, order, request)`.
    handoffs: BinaryHeap<Reverse<(Time, u64, RequestId)>>,
    /// Prompt hashes of requests in transfer, at the decode pool's block size.
    in_transfer: Vec<Option<Sequence>>,
    order: u64,
    next_turn: Vec<u32>,
    request_session: Vec<u32>,
    waiting_sessions: VecDeque<u32>,
    queue: Vec<Queued>,
    passes: u64,
    offload: Option<&'a mut Offload>,
}

/// Runs the workload to completion. `progress(simulated_ms, completed)` is called now and
/// then. With `offload`, every engine looks prompts up in and stores them to that store
/// (offline only). Online, the only failure is a worker thread that cannot start.
pub fn simulate(
    workload: &Workload,
    config: &SimConfig,
    offload: Option<&mut Offload>,
    progress: &mut dyn FnMut(f64, usize),
) -> crate::Result<SimResult> {
    let began = Instant::now();
    let mut pools = Vec::new();
    if let Some(p) = &config.prefill {
        let mut router = config.router.clone();
        if let RouterMode::KvRouter(c) = &mut router {
            c.router_track_active_blocks = false;
        }
        pools.push(Pool::new(&p.engine, p.workers, router, config.seed, true));
        let decode_router = match &config.router {
            RouterMode::KvRouter(c) => RouterMode::KvRouter(KvRouterConfig {
                overlap_score_credit: 0.0,
                router_assume_kv_reuse: false,
                router_track_prefill_tokens: false,
                ..c.clone()
            }),
            RouterMode::RoundRobin => RouterMode::RoundRobin,
        };
        pools.push(Pool::new(
            &config.engine,
            config.workers,
            decode_router,
            config.seed.wrapping_add(1),
            false,
        ));
    } else {
        pools.push(Pool::new(
            &config.engine,
            config.workers,
            config.router.clone(),
            config.seed,
            false,
        ));
    }
    let mut sim = Simulation {
        workload,
        config,
        collector: Collector::default(),
        pools,
        arrivals: BinaryHeap::new(),
        completions: BinaryHeap::new(),
        handoffs: BinaryHeap::new(),
        in_transfer: Vec::new(),
        order: 0,
        next_turn: vec![0; workload.sessions.len()],
        request_session: Vec::new(),
        waiting_sessions: VecDeque::new(),
        queue: Vec::new(),
        passes: 0,
        offload,
    };
    for (i, s) in workload.sessions.iter().enumerate() {
        match config.concurrency {
            Some(c) if i >= c as usize => sim.waiting_sessions.push_back(i as u32),
            Some(_) => sim.schedule_arrival(0.0, i as u32),
            None => sim.schedule_arrival(s.start_ms, i as u32),
        }
    }
    if config.online {
        let (tx, rx) = crossbeam_channel::unbounded();
        for (p, pool) in sim.pools.iter_mut().enumerate() {
            for (w, worker) in pool.workers.iter_mut().enumerate() {
                let ranks = std::mem::take(&mut worker.ranks);
                let live = LiveWorker::spawn(p, w, ranks, tx.clone())
                    .map_err(|e| crate::Error::io("cannot start a worker thread", e))?;
                worker.live = Some(live);
            }
        }
        sim.run_online(&rx, progress);
    } else {
        sim.run(progress);
    }
    let (prefill_workers, prefill_gpus_per_worker) = match &config.prefill {
        Some(p) => (u64::from(p.workers.max(1)), p.engine.gpus_per_worker()),
        None => (0, 0),
    };
    Ok(SimResult {
        collector: sim.collector,
        provision: Provision {
            prefill_workers,
            decode_workers: u64::from(config.workers.max(1)),
            prefill_gpus_per_worker,
            decode_gpus_per_worker: config.engine.gpus_per_worker(),
        },
        wall_ms: began.elapsed().as_secs_f64() * 1e3,
        passes: sim.passes,
    })
}

impl Simulation<'_> {
    fn schedule_arrival(&mut self, at: f64, session: u32) {
        self.arrivals.push(Reverse((Time(at), session)));
    }

    fn run(&mut self, progress: &mut dyn FnMut(f64, usize)) {
        let mut next_report = 0;
        loop {
            let next = [
                self.arrivals.peek().map(|Reverse((t, ..))| *t),
                self.completions.peek().map(|Reverse((t, ..))| *t),
                self.handoffs.peek().map(|Reverse((t, ..))| *t),
            ];
            let Some(now) = next.into_iter().flatten().min() else {
                break;
            };
            while let Some(&Reverse((t, _, pool, w))) = self.completions.peek() {
                if t > now {
                    break;
                }
                self.completions.pop();
                self.finish_pass(pool as usize, w as usize, now.0);
            }
            while let Some(&Reverse((t, _, id))) = self.handoffs.peek() {
                if t > now {
                    break;
                }
                self.handoffs.pop();
                self.hand_off(id);
            }
            while let Some(&Reverse((t, s))) = self.arrivals.peek() {
                if t > now {
                    break;
                }
                self.arrivals.pop();
                self.arrive(s, now.0);
            }
            self.start_idle_workers(now.0);
            if self.passes >= next_report {
                next_report = self.passes + 4096;
                progress(now.0, self.collector.completed());
            }
        }
        self.final_progress(progress);
    }

    /// Releases queued requests and starts a pass on every idle worker with work.
    fn start_idle_workers(&mut self, now: f64) {
        self.drain_queue();
        for pool in 0..self.pools.len() {
            for w in 0..self.pools[pool].workers.len() {
                if !self.pools[pool].workers[w].busy {
                    self.start_pass(pool, w, now);
                }
            }
        }
    }

    /// Online: the same steps on the wall clock. Arrivals and handoffs fall due at their
    /// real time; passes end when the worker threads report. Times are measured, so two
    /// runs differ by scheduling jitter.
    fn run_online(&mut self, done: &Receiver<Done>, progress: &mut dyn FnMut(f64, usize)) {
        let began = Instant::now();
        let elapsed = || began.elapsed().as_secs_f64() * 1e3;
        let mut last_report = 0.0;
        loop {
            let now = elapsed();
            while let Some(&Reverse((t, _, id))) = self.handoffs.peek() {
                if t.0 > now {
                    break;
                }
                self.handoffs.pop();
                self.hand_off(id);
            }
            while let Some(&Reverse((t, s))) = self.arrivals.peek() {
                if t.0 > now {
                    break;
                }
                self.arrivals.pop();
                self.arrive(s, now);
            }
            self.start_idle_workers(now);
            let busy = self.pools.iter().flat_map(|p| &p.workers).any(|w| w.busy);
            let next = [
                self.arrivals.peek().map(|Reverse((t, ..))| *t),
                self.handoffs.peek().map(|Reverse((t, ..))| *t),
            ]
            .into_iter()
            .flatten()
            .min();
            let report = match next {
                Some(t) => {
                    let due = began + Duration::from_secs_f64(t.0.max(0.0) / 1e3);
                    done.recv_deadline(due).ok()
                }
                None if busy => done.recv().ok(),
                None => break,
            };
            if let Some(report) = report {
                let now = elapsed();
                let worker = &mut self.pools[report.pool].workers[report.worker];
                if let Some(live) = worker.live.as_mut() {
                    live.has_work = !report.idle && !report.outputs.is_empty();
                }
                if !report.outputs.is_empty() {
                    self.passes += 1;
                }
                worker.pending = report.outputs;
                self.finish_pass(report.pool, report.worker, now);
            }
            if now - last_report > 100.0 {
                last_report = now;
                progress(now, self.collector.completed());
            }
        }
        self.final_progress(progress);
    }

    fn final_progress(&self, progress: &mut dyn FnMut(f64, usize)) {
        progress(
            self.collector
                .records
                .iter()
                .filter_map(|r| r.terminal_time_ms)
                .fold(0.0, f64::max),
            self.collector.completed(),
        );
    }

    /// The next turn of `session` arrives: record it and route it (or queue it).
    fn arrive(&mut self, session: u32, now: f64) {
        let s = &self.workload.sessions[session as usize];
        let turn_index = self.next_turn[session as usize];
        let turn = &s.turns[turn_index as usize];
        let name = s.id.clone().unwrap_or_else(|| session.to_string());
        let id = self
            .collector
            .arrive(name, turn_index, now, turn.prompt.len, turn.output_length);
        self.request_session.push(session);
        if let Some(o) = self.offload.as_deref_mut() {
            o.register(id, &turn.prompt);
        }
        let entry = &self.pools[ENTRY];
        let hashes: Arc<[u64]> = Arc::from(turn.prompt.block_hashes(entry.block_size));
        // A prefill worker generates one hidden token; the decode worker the visible ones.
        let output = if entry.prefill_only {
            1
        } else {
            turn.output_length
        };
        let sequence = Sequence::new(id, turn.prompt.len, output, hashes);
        if entry.prefill_only {
            let decode_hashes = Arc::from(turn.prompt.block_hashes(self.pools[1].block_size));
            self.in_transfer.resize_with(id as usize + 1, || None);
            self.in_transfer[id as usize] = Some(Sequence::prefilled(
                id,
                turn.prompt.len,
                turn.output_length,
                decode_hashes,
            ));
        }
        if entry.router.all_busy(entry.budget) {
            let policy = match entry.router.mode() {
                RouterMode::KvRouter(c) => c.router_queue_policy,
                RouterMode::RoundRobin => QueuePolicy::Fcfs,
            };
            let bump = turn.priority.max(0) as f64;
            let score = match policy {
                QueuePolicy::Fcfs => bump - now / 1e3,
                QueuePolicy::Lcfs => bump + now / 1e3,
                QueuePolicy::Wspt => {
                    let best = entry
                        .router
                        .best_uncached_tokens(&sequence.hashes, turn.prompt.len);
                    (1.0 + bump) / best.max(1) as f64
                }
            };
            self.order += 1;
            self.queue.push(Queued {
                strict: turn.strict_priority,
                score,
                order: self.order,
                id,
                sequence,
            });
        } else {
            self.dispatch(ENTRY, id, sequence);
        }
    }

    /// Releases queued requests, best first, while some candidate has room.
    fn drain_queue(&mut self) {
        while !self.queue.is_empty() && !self.entry_busy() {
            let best = (0..self.queue.len())
                .max_by(|&a, &b| {
                    let (x, y) = (&self.queue[a], &self.queue[b]);
                    (x.strict, x.score)
                        .partial_cmp(&(y.strict, y.score))
                        .unwrap_or(Ordering::Equal)
                        .then(y.order.cmp(&x.order))
                })
                .expect("non-empty");
            let q = self.queue.swap_remove(best);
            self.dispatch(ENTRY, q.id, q.sequence);
        }
    }

    fn entry_busy(&self) -> bool {
        let entry = &self.pools[ENTRY];
        entry.router.all_busy(entry.budget)
    }

    fn dispatch(&mut self, pool: usize, id: RequestId, sequence: Sequence) {
        let p = &mut self.pools[pool];
        let route = p
            .router
            .route(id, sequence.hashes.clone(), sequence.prompt_len);
        let (worker, rank) = (route.candidate / p.dp, route.candidate % p.dp);
        let record = &mut self.collector.records[id as usize];
        if pool == ENTRY {
            record.prefill_worker_idx = Some(worker as u32);
            record.prefill_route_overlap_tokens = Some(route.overlap_tokens);
        }
        if !p.prefill_only {
            record.decode_worker_idx = Some(worker as u32);
        }
        let w = &mut p.workers[worker];
        match w.live.as_mut() {
            Some(live) => live.enqueue(rank, sequence),
            None => w.ranks[rank].enqueue(sequence),
        }
    }

    /// The prompt's KV has reached the decode pool: a decode worker takes the request.
    fn hand_off(&mut self, id: RequestId) {
        if let Some(sequence) = self.in_transfer[id as usize].take() {
            self.dispatch(1, id, sequence);
            // Its prompt is computed: only its decode load counts.
            self.pools[1].router.prefill_done(id);
        }
    }

    /// Milliseconds to move a prompt's KV to the decode pool (zero without a link model).
    fn transfer_ms(&self, prompt_tokens: u32) -> f64 {
        let prefill = self.config.prefill.as_ref().map(|p| &p.engine);
        let pick = |f: fn(&EngineArgs) -> Option<f64>| {
            prefill.and_then(f).or_else(|| f(&self.config.engine))
        };
        let bytes = pick(|a| a.kv_bytes_per_token.map(|b| b as f64));
        match (bytes, pick(|a| a.kv_transfer_bandwidth)) {
            (Some(b), Some(gbps)) if gbps > 0.0 => f64::from(prompt_tokens) * b / (gbps * 1e6),
            _ => 0.0,
        }
    }

    fn start_pass(&mut self, pool: usize, w: usize, now: f64) {
        // The prompt runs where the store is consulted: the entry pool.
        let use_store = pool == ENTRY;
        let worker = &mut self.pools[pool].workers[w];
        if let Some(live) = &worker.live {
            if live.has_work {
                live.run_pass();
                worker.busy = true;
            }
            return;
        }
        let mut longest: Option<f64> = None;
        if let Some(o) = self.offload.as_deref_mut() {
            o.advance_to(now);
        }
        for (rank, engine) in worker.ranks.iter_mut().enumerate() {
            if engine.is_idle() {
                continue;
            }
            let connector = self
                .offload
                .as_deref_mut()
                .filter(|_| use_store)
                .map(|o| o as &mut dyn KvConnector);
            if let Some(out) = engine.pass(connector) {
                for &(id, reused) in &out.admitted {
                    if pool == ENTRY {
                        self.collector.admit(id, now, reused);
                    }
                }
                let end = out.end_ms(now);
                longest = Some(longest.map_or(end, |l: f64| l.max(end)));
                worker.pending.push((rank, out));
            }
        }
        if let Some(end) = longest {
            worker.busy = true;
            self.passes += 1;
            self.order += 1;
            self.completions
                .push(Reverse((Time(end), self.order, pool as u8, w as u32)));
        }
    }

    fn finish_pass(&mut self, pool: usize, w: usize, now: f64) {
        let p = &mut self.pools[pool];
        let (dp, prefill_only) = (p.dp, p.prefill_only);
        let pending = std::mem::take(&mut p.workers[w].pending);
        p.workers[w].busy = false;
        for (rank, out) in pending {
            self.pools[pool]
                .router
                .observe(w * dp + rank, &out.kv_events);
            for (id, done) in out.emitted {
                if prefill_only {
                    let router = &mut self.pools[pool].router;
                    router.prefill_done(id);
                    router.free(id);
                    let prompt = self.collector.records[id as usize].input_length;
                    let at = now + self.transfer_ms(prompt);
                    self.order += 1;
                    self.handoffs.push(Reverse((Time(at), self.order, id)));
                    continue;
                }
                let first = self.collector.records[id as usize].output_length == 0;
                self.collector.token(id, now);
                if first {
                    self.pools[pool].router.prefill_done(id);
                }
                if done {
                    self.end_request(pool, id, now, Status::Completed);
                }
            }
            for id in out.rejected {
                self.end_request(pool, id, now, Status::Rejected);
            }
        }
    }

    /// A request ended: its session's next turn follows after its delay, or, when the
    /// session is over, a closed loop releases the next session.
    fn end_request(&mut self, pool: usize, id: RequestId, now: f64, status: Status) {
        self.collector.finish(id, now, status);
        self.pools[pool].router.free(id);
        if let Some(slot) = self.in_transfer.get_mut(id as usize) {
            *slot = None;
        }
        if let Some(o) = self.offload.as_deref_mut() {
            o.forget(id);
        }
        let session = self.request_session[id as usize];
        let turns = &self.workload.sessions[session as usize].turns;
        let next = &mut self.next_turn[session as usize];
        *next += 1;
        if let Some(turn) = turns.get(*next as usize) {
            let at = now + turn.delay_ms;
            self.schedule_arrival(at, session);
        } else if let Some(s) = self.waiting_sessions.pop_front() {
            self.schedule_arrival(now, s);
        }
    }
}
