//! The offline simulation: a virtual clock that jumps from event to event (a pass ends, a
//! request arrives), so an hour of serving takes well under a second. At each instant it
//! applies finished passes, releases arrivals to the router, then starts a pass on every
//! idle worker that has work. Same-time events apply in the order they were scheduled, so a
//! run is a pure function of workload, configuration and seed.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use super::args::EngineArgs;
use super::collector::{Collector, Provision, Status};
use super::engine::{Engine, PassOutput, RequestId, Sequence};
use super::router::{QueuePolicy, Router, RouterMode};
use super::workload::Workload;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub engine: EngineArgs,
    pub workers: u32,
    pub router: RouterMode,
    /// Closed loop: at most this many requests (single-turn) or sessions in flight.
    pub concurrency: Option<u32>,
    /// Seeds the router's tie-breaking.
    pub seed: u64,
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
    ranks: Vec<Engine>,
    pending: Vec<(usize, PassOutput)>,
    busy: bool,
}

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
    router: Router,
    workers: Vec<Worker>,
    arrivals: BinaryHeap<Reverse<(Time, u64, u32)>>,
    completions: BinaryHeap<Reverse<(Time, u64, u32)>>,
    order: u64,
    next_turn: Vec<u32>,
    request_session: Vec<u32>,
    waiting_sessions: VecDeque<u32>,
    queue: Vec<Queued>,
    passes: u64,
}

/// Runs the workload to completion. `progress(virtual_ms, completed)` is called now and then.
pub fn simulate(
    workload: &Workload,
    config: &SimConfig,
    progress: &mut dyn FnMut(f64, usize),
) -> SimResult {
    let began = Instant::now();
    let dp = config.engine.dp_size.max(1) as usize;
    let candidates = config.workers.max(1) as usize * dp;
    let router = Router::new(
        config.router.clone(),
        candidates,
        config.engine.block_size,
        config.seed,
    );
    let track = router.uses_kv_events();
    let workers = (0..config.workers.max(1))
        .map(|_| Worker {
            ranks: (0..dp)
                .map(|_| Engine::new(config.engine.clone(), track, false))
                .collect(),
            pending: Vec::new(),
            busy: false,
        })
        .collect();
    let mut sim = Simulation {
        workload,
        config,
        collector: Collector::default(),
        router,
        workers,
        arrivals: BinaryHeap::new(),
        completions: BinaryHeap::new(),
        order: 0,
        next_turn: vec![0; workload.sessions.len()],
        request_session: Vec::new(),
        waiting_sessions: VecDeque::new(),
        queue: Vec::new(),
        passes: 0,
    };
    for (i, s) in workload.sessions.iter().enumerate() {
        match config.concurrency {
            Some(c) if i >= c as usize => sim.waiting_sessions.push_back(i as u32),
            Some(_) => sim.schedule_arrival(0.0, i as u32),
            None => sim.schedule_arrival(s.start_ms, i as u32),
        }
    }
    sim.run(progress);
    let gpus = config.engine.gpus_per_worker();
    SimResult {
        collector: sim.collector,
        provision: Provision {
            prefill_workers: 0,
            decode_workers: u64::from(config.workers.max(1)),
            prefill_gpus_per_worker: 0,
            decode_gpus_per_worker: gpus,
        },
        wall_ms: began.elapsed().as_secs_f64() * 1e3,
        passes: sim.passes,
    }
}

impl Simulation<'_> {
    fn schedule_arrival(&mut self, at: f64, session: u32) {
        self.order += 1;
        self.arrivals.push(Reverse((Time(at), self.order, session)));
    }

    fn run(&mut self, progress: &mut dyn FnMut(f64, usize)) {
        let mut next_report = 0;
        loop {
            let next_arrival = self.arrivals.peek().map(|Reverse((t, ..))| *t);
            let next_completion = self.completions.peek().map(|Reverse((t, ..))| *t);
            let now = match (next_arrival, next_completion) {
                (None, None) => break,
                (Some(a), None) => a,
                (None, Some(c)) => c,
                (Some(a), Some(c)) => a.min(c),
            };
            while let Some(&Reverse((t, _, w))) = self.completions.peek() {
                if t > now {
                    break;
                }
                self.completions.pop();
                self.finish_pass(w as usize, now.0);
            }
            while let Some(&Reverse((t, _, s))) = self.arrivals.peek() {
                if t > now {
                    break;
                }
                self.arrivals.pop();
                self.arrive(s, now.0);
            }
            self.drain_queue();
            for w in 0..self.workers.len() {
                if !self.workers[w].busy {
                    self.start_pass(w, now.0);
                }
            }
            if self.passes >= next_report {
                next_report = self.passes + 4096;
                progress(now.0, self.collector.completed());
            }
        }
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
        let hashes: Arc<[u64]> = Arc::from(turn.prompt.block_hashes(self.config.engine.block_size));
        let sequence = Sequence::new(id, turn.prompt.len, turn.output_length, hashes);
        let budget = self
            .config
            .engine
            .max_num_batched_tokens
            .unwrap_or(u64::MAX);
        if self.router.all_busy(budget) {
            let policy = match self.router.mode() {
                RouterMode::KvRouter(c) => c.router_queue_policy,
                RouterMode::RoundRobin => QueuePolicy::Fcfs,
            };
            let bump = turn.priority.max(0) as f64;
            let score = match policy {
                QueuePolicy::Fcfs => bump - now / 1e3,
                QueuePolicy::Lcfs => bump + now / 1e3,
                QueuePolicy::Wspt => {
                    let best = self
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
            self.dispatch(id, sequence);
        }
    }

    /// Releases queued requests, best first, while some candidate has room.
    fn drain_queue(&mut self) {
        let budget = self
            .config
            .engine
            .max_num_batched_tokens
            .unwrap_or(u64::MAX);
        while !self.queue.is_empty() && !self.router.all_busy(budget) {
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
            self.dispatch(q.id, q.sequence);
        }
    }

    fn dispatch(&mut self, id: RequestId, sequence: Sequence) {
        let route = self
            .router
            .route(id, sequence.hashes.clone(), sequence.prompt_len);
        let dp = self.config.engine.dp_size.max(1) as usize;
        let (worker, rank) = (route.candidate / dp, route.candidate % dp);
        let record = &mut self.collector.records[id as usize];
        record.prefill_worker_idx = Some(worker as u32);
        record.decode_worker_idx = Some(worker as u32);
        record.prefill_route_overlap_tokens = Some(route.overlap_tokens);
        self.workers[worker].ranks[rank].enqueue(sequence);
    }

    fn start_pass(&mut self, w: usize, now: f64) {
        let worker = &mut self.workers[w];
        let mut longest: Option<f64> = None;
        for (rank, engine) in worker.ranks.iter_mut().enumerate() {
            if engine.is_idle() {
                continue;
            }
            if let Some(out) = engine.pass() {
                for &(id, reused) in &out.admitted {
                    self.collector.admit(id, now, reused);
                }
                longest = Some(longest.unwrap_or(0.0).max(out.duration_ms));
                worker.pending.push((rank, out));
            }
        }
        if let Some(d) = longest {
            worker.busy = true;
            self.passes += 1;
            self.order += 1;
            self.completions
                .push(Reverse((Time(now + d), self.order, w as u32)));
        }
    }

    fn finish_pass(&mut self, w: usize, now: f64) {
        let dp = self.config.engine.dp_size.max(1) as usize;
        let pending = std::mem::take(&mut self.workers[w].pending);
        self.workers[w].busy = false;
        for (rank, out) in pending {
            self.router.observe(w * dp + rank, &out.kv_events);
            for (id, done) in out.emitted {
                let first = self.collector.records[id as usize].output_length == 0;
                self.collector.token(id, now);
                if first {
                    self.router.prefill_done(id);
                }
                if done {
                    self.end_request(id, now, Status::Completed);
                }
            }
            for id in out.rejected {
                self.end_request(id, now, Status::Rejected);
            }
        }
    }

    /// A request ended: its session's next turn follows after its delay, or, when the
    /// session is over, a closed loop releases the next session.
    fn end_request(&mut self, id: RequestId, now: f64, status: Status) {
        self.collector.finish(id, now, status);
        self.router.free(id);
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
