//! The simulation loop: a virtual clock that jumps from event to event (a pass ends, a KV
//! transfer completes, a request arrives), so an hour of serving takes well under a second.
//! At each instant it repeats, until nothing changes: apply the passes that ended, the
//! transfers that completed and the arrivals that are due, run the queued handoff actions,
//! then start a pass on every idle worker with work, prefill pool first, lowest worker
//! first (a pass that takes no time is applied at once and its worker tried again). Events
//! due together apply in the order they were scheduled, so a run is a pure function of
//! workload, configuration and seed.
//!
//! Disaggregated serving adds a prefill pool in front: a request's prompt runs there and
//! moves to a decode worker through the handoff of [`super::handoff`]; the decode worker
//! generates every visible token.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::args::{EngineArgs, EngineType, EngineVersion, TransferTiming};
use super::collector::{Collector, Provision, RequestRecord, Status};
use super::engine::{Engine, KvConnector, PassOutput, Request, RequestId, Reserved, StepWindow};
use super::handoff::{Action, ActionQueue, Handoff, HandoffOrder};
use super::lifecycle;
use super::live::{Done, LiveWorker};
use super::offload::Offload;
use super::router::{KvRouterConfig, QueuePolicy, Router, RouterMode};
use super::summary::{PlayEnd, PlayStatus};
use super::workload::{Run, Trigger, Workload};

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
    /// Hears each request as it ends (live figures while the run lasts).
    pub observer: Option<Arc<dyn RequestObserver>>,
}

/// What hears each request the moment it ends, with its whole record.
pub trait RequestObserver: Send + Sync + std::fmt::Debug {
    fn ended(&self, record: &RequestRecord);
}

pub struct SimResult {
    pub collector: Collector,
    pub provision: Provision,
    /// Real milliseconds the simulation took.
    pub wall_ms: f64,
    pub passes: u64,
    /// A signal stopped the run early: the requests not yet ended stay pending.
    pub interrupted: bool,
    /// Requests of a request graph never sent because one they wait for was rejected.
    pub skipped: u64,
    /// How each play of a request graph ended, by play number, under AISimulate's engine;
    /// empty otherwise.
    pub plays: Vec<PlayEnd>,
    /// A request graph's lifecycle transcript as AISimulate's driver records it, under its
    /// engine; empty otherwise.
    pub lifecycle: Vec<lifecycle::Event>,
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

/// Turns that fall due: `(time, session)`, taken in that order. Turns due together go in
/// session order, as Dynamo's workload driver releases them (a session has one turn due at
/// a time). Those known from the start are kept sorted, so that a worker under round robin
/// can tell which of them is the first it gets ([`Simulation::quiet_until`]); those made
/// as the run goes wait in a heap.
#[derive(Default)]
struct Arrivals {
    /// Latest first: the next is the last.
    known: Vec<(Time, u32)>,
    made: BinaryHeap<Reverse<(Time, u32)>>,
}

impl Arrivals {
    /// The turns due from the start, in any order.
    fn known(mut due: Vec<(Time, u32)>) -> Arrivals {
        due.sort_unstable_by(|a, b| b.cmp(a));
        Arrivals {
            known: due,
            made: BinaryHeap::new(),
        }
    }

    fn push(&mut self, at: f64, session: u32) {
        self.made.push(Reverse((Time(at), session)));
    }

    fn peek(&self) -> Option<(Time, u32)> {
        let made = self.made.peek().map(|Reverse(next)| *next);
        match (self.known.last().copied(), made) {
            (Some(known), Some(made)) => Some(known.min(made)),
            (known, made) => known.or(made),
        }
    }

    /// The next turn, if it is due by `now`.
    fn pop_due(&mut self, now: f64) -> Option<u32> {
        let next = self.peek().filter(|(t, _)| t.0 <= now)?;
        match self.known.last() == Some(&next) {
            true => self.known.pop(),
            false => self.made.pop().map(|Reverse(next)| next),
        };
        Some(next.1)
    }

    /// When the `j`th turn from the next (0: the next) falls due, or the first made during
    /// the run, if that comes first: before it, the turns come in the order known.
    fn nth(&self, j: usize) -> f64 {
        let made = self
            .made
            .peek()
            .map_or(f64::INFINITY, |Reverse((t, _))| t.0);
        let known = match self.known.len().checked_sub(j + 1) {
            Some(i) => self.known[i].0 .0,
            None => f64::INFINITY,
        };
        known.min(made)
    }
}

struct Worker {
    /// The engines, unless a live worker thread owns them.
    ranks: Vec<Engine>,
    live: Option<LiveWorker>,
    /// Each rank's output of its last pass, kept in place with its buffers: a simulation
    /// runs millions of passes, and allocating and moving their outputs was a fifth of it.
    outputs: Vec<PassOutput>,
    /// Ranks whose output waits for the pass to end.
    ran: Vec<usize>,
    busy: bool,
    /// When the pass or step in flight ends, while `busy`.
    until: f64,
    /// [`Worker::earliest_end`], once asked, until the worker's ranks change while it is
    /// busy (it is asked of a busy worker only): it is forgotten where a pass starts, a
    /// request is placed here, a handoff asks for room here or frees a prompt here (a
    /// refused handoff frees its prompt at once). An activation, and the release that
    /// follows one, wait for a busy worker's pass to end.
    earliest_end: Option<f64>,
    /// Passes since the worker last held no request (AISimulate's wave step).
    wave_step: u64,
}

impl Worker {
    /// The earliest this worker can end a request (finish it, or reject it) where none
    /// reaches it meanwhile: when its pass in flight ends, where that pass ends one; else
    /// the passes its ranks are certain to end none in ([`Engine::earliest_end`]). `now`
    /// where it is between passes with work to do. Where handoff actions wait for its pass
    /// to end (`handed`), the pass's end: an activation there may bring a request whose
    /// first pass is its last.
    fn earliest_end(&mut self, now: f64, handed: bool) -> f64 {
        if !self.busy {
            return match self.ranks.iter().all(Engine::is_drained) {
                true => f64::INFINITY,
                false => now,
            };
        }
        if handed {
            return self.until;
        }
        if let Some(end) = self.earliest_end {
            return end;
        }
        let ends_one = self.ran.iter().any(|&rank| {
            let out = &self.outputs[rank];
            out.emitted.iter().any(|&(_, last)| last)
                || !out.rejected.is_empty()
                || !out.held.is_empty()
        });
        let end = match ends_one {
            true => self.until,
            false => Engine::earliest_end(&self.ranks, self.until),
        };
        self.earliest_end = Some(end);
        end
    }

    /// The earliest its next pass can end: the one in flight's end, `now` where it is
    /// between passes with a request to schedule, infinite where it has none. A prefill
    /// worker's pass may hold a prompt for its handoff, which then reaches the decode pool.
    fn next_pass_end(&self, now: f64) -> f64 {
        match (self.busy, self.ranks.iter().all(Engine::is_idle)) {
            (true, _) => self.until,
            (false, false) => now,
            (false, true) => f64::INFINITY,
        }
    }

    /// The wave starts over once the worker holds no request, as AISimulate's does.
    fn settle_wave(&mut self) {
        Engine::settle_wave(&self.ranks, &mut self.wave_step);
    }

    /// Rank `rank` frees the KV it held for request `id`'s handoff.
    fn release_source(&mut self, rank: usize, id: RequestId) {
        match self.live.as_mut() {
            Some(live) => live.release_source(rank, id),
            None => {
                self.ranks[rank].release_source(id);
                self.earliest_end = None;
                self.settle_wave();
            }
        }
    }

    /// Each rank tries its first waiting destination once more, as a pass's end does; the
    /// reservations made.
    fn retry_destinations(&mut self) -> Vec<Reserved> {
        self.ranks
            .iter_mut()
            .filter_map(Engine::retry_destinations)
            .collect()
    }
}

/// Workers of one kind and the router that places requests on them.
struct Pool {
    workers: Vec<Worker>,
    router: Router,
    dp: usize,
    block_size: u32,
    /// Blocks of one engine's KV pool.
    capacity_blocks: u64,
    budget: u64,
    /// Prompts run here and move on to the decode pool.
    prefill_only: bool,
    /// A pass that does nothing still ends, retrying the destinations (AISimulate's engine).
    empty_pass_retries: bool,
}

impl Pool {
    /// A pool of `workers` workers, each of the engine's `dp_size` ranks. An aggregated pool's
    /// round robin visits rank 0 of every worker first, as both peers do; a disaggregated
    /// pool's (`disaggregated`) takes the ranks in order, each worker's in turn, as
    /// AISimulate's pool placement does (Dynamo 1.4.2 refuses DP ranks there).
    fn new(
        args: &EngineArgs,
        workers: u32,
        router: RouterMode,
        seed: u64,
        prefill_only: bool,
        disaggregated: bool,
    ) -> Pool {
        let dp = args.dp_size.max(1) as usize;
        let router = Router::new(router, workers.max(1) as usize * dp, args.block_size, seed);
        let router = if disaggregated {
            router
        } else {
            router.with_ranks(dp)
        };
        let track = router.uses_kv_events();
        Pool {
            workers: (0..workers.max(1))
                .map(|_| Worker {
                    ranks: (0..dp)
                        .map(|_| Engine::new(args.clone(), track, prefill_only))
                        .collect(),
                    live: None,
                    outputs: (0..dp).map(|_| PassOutput::default()).collect(),
                    ran: Vec::new(),
                    busy: false,
                    until: 0.0,
                    earliest_end: None,
                    wave_step: 0,
                })
                .collect(),
            router,
            dp,
            block_size: args.block_size,
            capacity_blocks: args.num_gpu_blocks,
            budget: args.max_num_batched_tokens.unwrap_or(u64::MAX),
            prefill_only,
            empty_pass_retries: args.engine_version == EngineVersion::Aisimulate013,
        }
    }
}

/// The pools of a run, entry first; a disaggregated run's decode pool second.
const ENTRY: usize = 0;
const DECODE: usize = 1;

/// A request waiting in the router's queue: higher `(strict, score)` goes first.
struct Queued {
    strict: u64,
    score: f64,
    order: u64,
    request: Request,
}

/// A disaggregated request on its way through the handoff.
struct InFlight {
    handoff: Handoff,
    /// Its prefill request until submitted, its decode request until reserved.
    prefill: Option<Request>,
    decode: Option<Request>,
    /// `(worker, rank)` on each side once placed.
    prefill_at: Option<(usize, usize)>,
    decode_at: Option<(usize, usize)>,
}

struct Simulation<'a> {
    workload: &'a Workload,
    config: &'a SimConfig,
    collector: Collector,
    pools: Vec<Pool>,
    arrivals: Arrivals,
    /// Pass ends: `(time, order, pool, worker)`.
    completions: BinaryHeap<Reverse<(Time, u64, u8, u32)>>,
    /// KV transfers that complete: `(time, order, request)`.
    transfers: BinaryHeap<Reverse<(Time, u64, RequestId)>>,
    order: u64,
    next_turn: Vec<u32>,
    request_session: Vec<u32>,
    waiting_sessions: VecDeque<u32>,
    queue: Vec<Queued>,
    passes: u64,
    interrupted: bool,
    offload: Option<&'a mut Offload>,
    /// Disaggregated requests by id (`None` once handed off, and in aggregated runs).
    in_flight: Vec<Option<InFlight>>,
    actions: ActionQueue,
    order_of_handoff: HandoffOrder,
    /// `drive`'s workers with nothing to start (its list, kept for its allocation).
    skip: Vec<usize>,
    /// An agentic workload's dependencies, released as requests are sent and end.
    dependents: Option<Dependents>,
    /// Workers may run their quiet decode passes as one step ([`Engine::coast_ranks`]) when
    /// nothing but an arrival (or, to a decode worker, a handoff) brings a worker work: a
    /// worker's passes before the next arrival are then its own business. The arrivals not
    /// yet in `arrivals` are made by requests' ends at least this long before them (see
    /// [`arrival_lead`]), so none of those comes before the earliest another worker can end
    /// a request plus it ([`Simulation::quiet_until`]).
    coasting: Option<f64>,
    /// Steps run (each of one or more quiet passes).
    steps: u64,
}

/// What each session of an agentic workload releases, and what each still waits for.
struct Dependents {
    /// `(session, delay)` pairs released when a session's request is sent / ends.
    on_dispatch: Vec<Vec<(u32, f64)>>,
    on_completion: Vec<Vec<(u32, f64)>>,
    remaining: Vec<usize>,
    /// The earliest a session may start: its own arrival, then each fired wait's time.
    ready_after: Vec<f64>,
    /// Whether a rejected request ends its play, AISimulate's driver's rule: every request
    /// of the play not yet sent is skipped, those already sent run on. Otherwise a
    /// rejection releases what waits for it as a completion does.
    skip_after_rejection: bool,
    /// Each play's sessions ([`crate::workload::Graph::plays`]), and whether one failed.
    plays: Vec<Vec<u32>>,
    play_failed: Vec<bool>,
    sent: Vec<bool>,
    /// Sessions that will never be sent, as a request of their play was rejected.
    skipped: Vec<bool>,
}

impl Dependents {
    fn new(workload: &Workload, skip_after_rejection: bool) -> Option<Dependents> {
        let graph = workload.graph.as_ref()?;
        let n = workload.sessions.len();
        let mut d = Dependents {
            on_dispatch: vec![Vec::new(); n],
            on_completion: vec![Vec::new(); n],
            remaining: vec![0; n],
            ready_after: workload.sessions.iter().map(|s| s.start_ms).collect(),
            skip_after_rejection,
            plays: Vec::new(),
            play_failed: Vec::new(),
            sent: vec![false; n],
            skipped: vec![false; n],
        };
        for (session, &play) in graph.plays.iter().enumerate().take(n) {
            let play = play as usize;
            if d.plays.len() <= play {
                d.plays.resize(play + 1, Vec::new());
            }
            d.plays[play].push(session as u32);
        }
        d.play_failed = vec![false; d.plays.len()];
        for (i, waits) in graph.waits.iter().enumerate().take(n) {
            d.remaining[i] = waits.len();
            for w in waits {
                let list = match w.trigger {
                    Trigger::Dispatch => &mut d.on_dispatch,
                    Trigger::Completion => &mut d.on_completion,
                };
                list[w.on as usize].push((i as u32, w.delay_ms));
            }
        }
        Some(d)
    }

    /// A request of `play` was rejected: the play's first failure skips every request of it
    /// not yet sent, whether still waiting or due later.
    fn fail(&mut self, play: u32) {
        let play = play as usize;
        if std::mem::replace(&mut self.play_failed[play], true) {
            return;
        }
        for &s in &self.plays[play] {
            let s = s as usize;
            self.skipped[s] |= !self.sent[s];
        }
    }
}

/// The least virtual time between an event and an arrival it makes: the smallest delay
/// before a session's later turn or a dependent request (a finish at `t` makes no arrival
/// before `t` plus it); none in a closed loop, which starts a session the moment another
/// ends. Infinite when every arrival is known from the start.
fn arrival_lead(workload: &Workload, concurrency: Option<u32>) -> f64 {
    if concurrency.is_some() {
        return 0.0;
    }
    let turns = workload
        .sessions
        .iter()
        .flat_map(|s| s.turns.iter().skip(1).map(|t| t.delay_ms));
    let waits = workload
        .graph
        .iter()
        .flat_map(|g| g.waits.iter().flatten().map(|w| w.delay_ms));
    // A delay that is not a number, or is negative, leaves no lead.
    turns.chain(waits).fold(
        f64::INFINITY,
        |lead, d| if d >= 0.0 { lead.min(d) } else { 0.0 },
    )
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
    run_simulation(workload, config, offload, progress, true).map(|(result, _)| result)
}

/// [`simulate`], its workers' quiet passes run as steps where they may (`steps`) or every
/// pass on its own, which gives the same run; also how many steps ran.
fn run_simulation(
    workload: &Workload,
    config: &SimConfig,
    offload: Option<&mut Offload>,
    progress: &mut dyn FnMut(f64, usize),
    steps: bool,
) -> crate::Result<(SimResult, u64)> {
    let began = Instant::now();
    let mut pools = Vec::new();
    if let Some(p) = &config.prefill {
        let mut router = config.router.clone();
        if let RouterMode::KvRouter(c) = &mut router {
            c.router_track_active_blocks = false;
        }
        pools.push(Pool::new(
            &p.engine,
            p.workers,
            router,
            config.seed,
            true,
            true,
        ));
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
            true,
        ));
    } else {
        pools.push(Pool::new(
            &config.engine,
            config.workers,
            config.router.clone(),
            config.seed,
            false,
            false,
        ));
    }
    let workers_per_pool: Vec<usize> = pools.iter().map(|p| p.workers.len()).collect();
    // Every turn becomes one request record: sized once, the list holds no doubling's slack
    // and is never copied while both its old and new buffers are resident (a tenth of a
    // 12,000-request simulation's peak memory).
    let turns: usize = workload.sessions.iter().map(|s| s.turns.len()).sum();
    // With a second core, the pooled token gaps are folded beside the simulation.
    let mut collector = Collector::beside();
    collector.records.reserve_exact(turns);
    // A request the router queues is released when another worker's pass ends, and an
    // offload store's work runs between passes: either could reach a worker in the middle
    // of its step. A handoff reaches the decode pool only where a prompt arrives, a prefill
    // pass ends or a transfer completes, which bound a decode worker's step.
    let router_queues = matches!(
        &config.router,
        RouterMode::KvRouter(KvRouterConfig {
            router_queue_threshold: Some(_),
            ..
        })
    );
    let coasting = (steps && !config.online && offload.is_none() && !router_queues)
        .then(|| arrival_lead(workload, config.concurrency));
    let mut sim = Simulation {
        workload,
        config,
        collector,
        pools,
        arrivals: Arrivals::default(),
        completions: BinaryHeap::new(),
        transfers: BinaryHeap::new(),
        order: 0,
        next_turn: vec![0; workload.sessions.len()],
        request_session: Vec::with_capacity(turns),
        waiting_sessions: VecDeque::new(),
        queue: Vec::new(),
        passes: 0,
        interrupted: false,
        offload,
        in_flight: Vec::new(),
        actions: ActionQueue::new(&workers_per_pool),
        order_of_handoff: match config.engine.engine_type {
            EngineType::Sglang => HandoffOrder::DestinationFirst,
            _ => HandoffOrder::SourceFirst,
        },
        skip: Vec::new(),
        dependents: Dependents::new(
            workload,
            config.engine.engine_version == EngineVersion::Aisimulate013,
        ),
        coasting,
        steps: 0,
    };
    let mut due = Vec::new();
    for (i, s) in workload.sessions.iter().enumerate() {
        if sim.dependents.as_ref().is_some_and(|d| d.remaining[i] > 0) {
            continue;
        }
        match config.concurrency {
            Some(c) if i >= c as usize => sim.waiting_sessions.push_back(i as u32),
            Some(_) => due.push((Time(0.0), i as u32)),
            None => due.push((Time(s.start_ms), i as u32)),
        }
    }
    sim.arrivals = Arrivals::known(due);
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
    sim.collector.settle();
    let plays = sim.play_ends();
    let lifecycle = sim.lifecycle();
    let (prefill_workers, prefill_gpus_per_worker) = match &config.prefill {
        Some(p) => (u64::from(p.workers.max(1)), p.engine.gpus_per_worker()),
        None => (0, 0),
    };
    let steps = sim.steps;
    let result = SimResult {
        collector: sim.collector,
        provision: Provision {
            prefill_workers,
            decode_workers: u64::from(config.workers.max(1)),
            prefill_gpus_per_worker,
            decode_gpus_per_worker: config.engine.gpus_per_worker(),
            by_duration: config.engine.engine_version == EngineVersion::Dynamo142
                && (config.online
                    || (config.prefill.is_none()
                        && config.workers <= 1
                        && config.engine.dp_size <= 1)),
        },
        wall_ms: began.elapsed().as_secs_f64() * 1e3,
        passes: sim.passes,
        interrupted: sim.interrupted,
        skipped: sim
            .dependents
            .as_ref()
            .map_or(0, |d| d.skipped.iter().filter(|&&s| s).count() as u64),
        plays,
        lifecycle,
    };
    Ok((result, steps))
}

impl Simulation<'_> {
    fn disaggregated(&self) -> bool {
        self.pools.len() > 1
    }

    /// The engine version of the prefill pool, when serving is disaggregated.
    fn prefill_engine_version(&self) -> Option<EngineVersion> {
        self.config
            .prefill
            .as_ref()
            .map(|p| p.engine.engine_version)
    }

    fn schedule_arrival(&mut self, at: f64, session: u32) {
        self.arrivals.push(at, session);
    }

    fn run(&mut self, progress: &mut dyn FnMut(f64, usize)) {
        let mut next_report = 0;
        loop {
            let next = [
                self.arrivals.peek().map(|(t, _)| t),
                self.completions.peek().map(|Reverse((t, ..))| *t),
                self.transfers.peek().map(|Reverse((t, ..))| *t),
            ];
            let Some(now) = next.into_iter().flatten().min() else {
                break;
            };
            if crate::interrupt::requested().is_some() {
                self.interrupted = true;
                break;
            }
            self.settle(now.0);
            if self.passes >= next_report {
                next_report = self.passes + 4096;
                progress(now.0, self.collector.completed());
            }
        }
        self.final_progress(progress);
    }

    /// Applies everything due at `now` until nothing more changes.
    fn settle(&mut self, now: f64) {
        loop {
            let mut changed = false;
            while let Some(&Reverse((t, _, pool, w))) = self.completions.peek() {
                if t.0 > now {
                    break;
                }
                self.completions.pop();
                self.finish_pass(pool as usize, w as usize, now);
                changed = true;
            }
            while let Some(&Reverse((t, _, id))) = self.transfers.peek() {
                if t.0 > now {
                    break;
                }
                self.transfers.pop();
                self.transferred(id);
                changed = true;
            }
            while let Some(s) = self.arrivals.pop_due(now) {
                self.arrive(s, now);
                changed = true;
            }
            changed |= self.run_actions(now);
            for pool in 0..self.pools.len() {
                changed |= self.drive(pool, now);
            }
            if !changed {
                break;
            }
        }
    }

    /// Starts passes on `pool`'s idle workers with work, lowest first; a pass that takes no
    /// time is applied at once and its worker tried again. Whether anything happened.
    fn drive(&mut self, pool: usize, now: f64) -> bool {
        if pool == ENTRY {
            self.drain_queue();
        }
        // Workers whose pass could not start; almost always none, so a list, not a mask:
        // this runs twice for every pass of a simulation.
        let mut skip = std::mem::take(&mut self.skip);
        skip.clear();
        let mut changed = false;
        loop {
            let workers = &self.pools[pool].workers;
            let next = (0..workers.len()).find(|&w| {
                let worker = &workers[w];
                !worker.busy && !skip.contains(&w) && worker.ranks.iter().any(|e| !e.is_idle())
            });
            let Some(w) = next else {
                break;
            };
            match self.start_pass(pool, w, now) {
                Some(end) if end > now => changed = true,
                Some(_) => {
                    self.finish_pass(pool, w, now);
                    changed = true;
                }
                None if self.pools[pool].empty_pass_retries => {
                    // AISimulate's engine completes a pass that did nothing too, and its end
                    // retries the worker's waiting destinations: each one reserved lets the
                    // worker pass again at the same instant.
                    let retried = self.pools[pool].workers[w].retry_destinations();
                    if retried.is_empty() {
                        skip.push(w);
                    }
                    for r in retried {
                        self.reserved(r, now);
                        changed = true;
                    }
                }
                None => skip.push(w),
            }
        }
        self.skip = skip;
        changed
    }

    /// Online: the same steps on the wall clock. Arrivals and transfers fall due at their
    /// real time; passes end when the worker threads report; a worker thread runs handoff
    /// commands between its passes. Times are measured, so two runs differ by scheduling
    /// jitter.
    fn run_online(&mut self, done: &Receiver<Done>, progress: &mut dyn FnMut(f64, usize)) {
        let began = Instant::now();
        let elapsed = || began.elapsed().as_secs_f64() * 1e3;
        let mut last_report = 0.0;
        // Waits are cut into slices so that a signal is noticed within one.
        let slice = Duration::from_millis(100);
        loop {
            if crate::interrupt::requested().is_some() {
                self.interrupted = true;
                break;
            }
            let now = elapsed();
            while let Some(&Reverse((t, _, id))) = self.transfers.peek() {
                if t.0 > now {
                    break;
                }
                self.transfers.pop();
                self.transferred(id);
            }
            while let Some(s) = self.arrivals.pop_due(now) {
                self.arrive(s, now);
            }
            self.run_actions(now);
            self.drain_queue();
            for pool in 0..self.pools.len() {
                for w in 0..self.pools[pool].workers.len() {
                    let worker = &mut self.pools[pool].workers[w];
                    if let Some(live) = worker.live.as_mut().filter(|l| !worker.busy && l.has_work)
                    {
                        live.run_pass();
                        worker.busy = true;
                    }
                }
            }
            let busy = self.pools.iter().flat_map(|p| &p.workers).any(|w| w.busy);
            let next = [
                self.arrivals.peek().map(|(t, _)| t),
                self.transfers.peek().map(|Reverse((t, ..))| *t),
            ]
            .into_iter()
            .flatten()
            .min();
            let report = match next {
                Some(t) => {
                    let due = began + Duration::from_secs_f64(t.0.max(0.0) / 1e3);
                    done.recv_deadline(due.min(Instant::now() + slice)).ok()
                }
                None if busy || !self.actions.is_empty() => done.recv_timeout(slice).ok(),
                None => break,
            };
            if let Some(report) = report {
                let now = elapsed();
                for r in report.reserved {
                    self.reserved(r, now);
                }
                if report.ran_pass {
                    let worker = &mut self.pools[report.pool].workers[report.worker];
                    if let Some(live) = worker.live.as_mut() {
                        live.has_work = !report.idle && !report.outputs.is_empty();
                    }
                    if !report.outputs.is_empty() {
                        self.passes += 1;
                    }
                    for (rank, out) in report.outputs {
                        if worker.outputs.len() <= rank {
                            worker.outputs.resize_with(rank + 1, PassOutput::default);
                        }
                        worker.outputs[rank] = out;
                        worker.ran.push(rank);
                    }
                    self.finish_pass(report.pool, report.worker, now);
                }
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

    /// Each session's request record, `None` for one never sent (a request graph's session
    /// holds one request).
    fn record_of_session(&self, sessions: usize) -> Vec<Option<&RequestRecord>> {
        let mut record_of = vec![None; sessions];
        for (id, &session) in self.request_session.iter().enumerate() {
            record_of[session as usize] = self.collector.records.get(id);
        }
        record_of
    }

    /// A request graph's lifecycle transcript, under AISimulate's engine.
    fn lifecycle(&self) -> Vec<lifecycle::Event> {
        let Some(d) = self.dependents.as_ref().filter(|d| d.skip_after_rejection) else {
            return Vec::new();
        };
        let mut nodes: Vec<lifecycle::Node> = self
            .record_of_session(d.sent.len())
            .into_iter()
            .zip(&d.skipped)
            .map(|(r, &skipped)| lifecycle::Node {
                play: 0,
                sent: r.map(|r| {
                    let end = r.terminal_time_ms.map(|at| (at, r.terminal_status));
                    (r.arrival_time_ms, end)
                }),
                skipped,
            })
            .collect();
        for (play, sessions) in d.plays.iter().enumerate() {
            for &s in sessions {
                nodes[s as usize].play = play as u32;
            }
        }
        lifecycle::events(&nodes, d.plays.len())
    }

    /// How each play of a request graph ended, under AISimulate's engine.
    fn play_ends(&self) -> Vec<PlayEnd> {
        let Some(d) = self.dependents.as_ref().filter(|d| d.skip_after_rejection) else {
            return Vec::new();
        };
        let record_of = self.record_of_session(d.sent.len());
        d.plays
            .iter()
            .map(|sessions| {
                let (mut last, mut failure, mut open) =
                    (None::<f64>, None::<(f64, u32, Status)>, false);
                for &s in sessions {
                    let Some(r) = record_of[s as usize] else {
                        open |= !d.skipped[s as usize];
                        continue;
                    };
                    let Some(at) = r.terminal_time_ms else {
                        open = true;
                        continue;
                    };
                    last = Some(last.map_or(at, |l| l.max(at)));
                    if r.terminal_status.is_failure()
                        && failure.is_none_or(|(first, ..)| at < first)
                    {
                        failure = Some((at, s, r.terminal_status));
                    }
                }
                let status = match (open, failure) {
                    (true, _) => PlayStatus::Incomplete,
                    (false, Some(_)) => PlayStatus::Failed,
                    (false, None) => PlayStatus::Completed,
                };
                PlayEnd {
                    status,
                    causal_terminal_ms: failure.map(|(at, ..)| at).or(last),
                    settled_at_ms: if open { None } else { last },
                    failure: failure.map(|(_, s, status)| (s, status)),
                }
            })
            .collect()
    }

    /// The next turn of `session` arrives: record it, then route it (or queue it) — or,
    /// disaggregated, start its handoff.
    fn arrive(&mut self, session: u32, now: f64) {
        if let Some(d) = self.dependents.as_mut() {
            if d.skipped[session as usize] {
                return;
            }
            d.sent[session as usize] = true;
        }
        let s = &self.workload.sessions[session as usize];
        let turn_index = self.next_turn[session as usize];
        let turn = &s.turns[turn_index as usize];
        let name = s.id.clone().unwrap_or_else(|| session.to_string());
        let id = self
            .collector
            .arrive(name, turn_index, now, turn.prompt.len, turn.output_length);
        self.collector.records[id as usize].play = self
            .workload
            .graph
            .as_ref()
            .map(|g| g.plays[session as usize]);
        self.request_session.push(session);
        self.release(session, Trigger::Dispatch, now);
        if let Some(o) = self.offload.as_deref_mut() {
            o.register(id, &turn.prompt);
        }
        // The blocks a turn's output completes are a later prompt's when its session repeats
        // that output; otherwise they are unique and the engines name them.
        let hashes = |block_size: u32| -> (Arc<[u64]>, Arc<[u64]>) {
            match turn.output_content {
                Some(id) => {
                    let output = Run {
                        id,
                        tokens: turn.output_length,
                    };
                    let (prompt, output) = turn.prompt.block_hashes_with_output(block_size, output);
                    (Arc::from(prompt), Arc::from(output))
                }
                None => (
                    Arc::from(turn.prompt.block_hashes(block_size)),
                    Arc::from(Vec::new()),
                ),
            }
        };
        let (entry_hashes, entry_output) = hashes(self.pools[ENTRY].block_size);
        if !self.disaggregated() {
            let request = Request::new(id, turn.prompt.len, turn.output_length, entry_hashes)
                .with_output_hashes(entry_output);
            self.route_entry(request, turn.priority, turn.strict_priority, now);
            return;
        }
        // Dynamo 1.4.2's prefill worker generates a planned output unseen before the hand-off;
        // AISimulate's stops its prefill request at one token.
        let dynamo = self.prefill_engine_version() == Some(EngineVersion::Dynamo142);
        let planned = if self.workload.planned_outputs && dynamo {
            turn.output_length
        } else {
            1
        };
        let (decode_hashes, decode_output) = hashes(self.pools[DECODE].block_size);
        let full_prompt = self
            .config
            .prefill
            .as_ref()
            .is_none_or(|p| p.engine.kv_transfer_timing == TransferTiming::FullPrompt);
        let mut handoff = Handoff::new(self.order_of_handoff, turn.prompt.len, full_prompt);
        let first = handoff.start();
        self.in_flight.resize_with(id as usize + 1, || None);
        self.in_flight[id as usize] = Some(InFlight {
            handoff,
            prefill: Some(
                Request::new(id, turn.prompt.len, planned, entry_hashes)
                    .with_output_hashes(entry_output),
            ),
            decode: Some(
                Request::prefilled(id, turn.prompt.len, turn.output_length, decode_hashes)
                    .with_output_hashes(decode_output),
            ),
            prefill_at: None,
            decode_at: None,
        });
        self.actions.push(id, Some(first));
    }

    /// Routes a request to the entry pool, or queues it in the router while every
    /// candidate is busy.
    fn route_entry(&mut self, request: Request, priority: i64, strict: u64, now: f64) {
        let entry = &self.pools[ENTRY];
        if entry.router.all_busy(entry.budget) {
            let policy = match entry.router.mode() {
                RouterMode::KvRouter(c) => c.router_queue_policy,
                RouterMode::RoundRobin => QueuePolicy::Fcfs,
            };
            let bump = priority.max(0) as f64;
            let score = match policy {
                QueuePolicy::Fcfs => bump - now / 1e3,
                QueuePolicy::Lcfs => bump + now / 1e3,
                QueuePolicy::Wspt => {
                    let best = entry
                        .router
                        .best_uncached_tokens(&request.hashes, request.prompt_len);
                    (1.0 + bump) / best.max(1) as f64
                }
            };
            self.order += 1;
            self.queue.push(Queued {
                strict,
                score,
                order: self.order,
                request,
            });
        } else {
            self.dispatch(ENTRY, request);
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
            self.dispatch(ENTRY, q.request);
        }
    }

    fn entry_busy(&self) -> bool {
        let entry = &self.pools[ENTRY];
        entry.router.all_busy(entry.budget)
    }

    /// Places a request on the entry pool's chosen worker.
    fn dispatch(&mut self, pool: usize, request: Request) {
        let id = request.id;
        let p = &mut self.pools[pool];
        let route = p
            .router
            .route(id, request.hashes.clone(), request.prompt_len);
        let (worker, rank) = (route.candidate / p.dp, route.candidate % p.dp);
        let prefill_only = p.prefill_only;
        let record = &mut self.collector.records[id as usize];
        // A record names the rank (worker × dp_size + rank), as AISimulate's does.
        if prefill_only {
            record.prefill_worker_idx = Some(route.candidate as u32);
            record.prefill_route_overlap_tokens = Some(route.overlap_tokens);
        } else {
            record.decode_worker_idx = Some(route.candidate as u32);
        }
        if let Some(f) = self.in_flight.get_mut(id as usize).and_then(Option::as_mut) {
            f.prefill_at = Some((worker, rank));
        }
        let w = &mut p.workers[worker];
        w.earliest_end = None;
        match w.live.as_mut() {
            Some(live) => live.enqueue(rank, request),
            None => w.ranks[rank].enqueue(request),
        }
    }

    /// Runs the queued handoff actions, first in first out; whether any ran.
    fn run_actions(&mut self, now: f64) -> bool {
        let mut ran = false;
        while let Some((id, action)) = self.actions.pop() {
            ran |= self.execute(id, action, now);
        }
        ran
    }

    fn flight(&mut self, id: RequestId) -> Option<&mut InFlight> {
        self.in_flight.get_mut(id as usize).and_then(Option::as_mut)
    }

    /// Runs one handoff action; false when it must wait for a worker's pass to end.
    fn execute(&mut self, id: RequestId, action: Action, now: f64) -> bool {
        match action {
            Action::SubmitPrefill => {
                let Some(request) = self.flight(id).and_then(|f| f.prefill.take()) else {
                    return true;
                };
                let turn = self.turn_of(id);
                let (priority, strict) = (turn.priority, turn.strict_priority);
                self.route_entry(request, priority, strict, now);
            }
            Action::ReserveDestination => self.reserve_destination(id, now),
            Action::StartTransfer { tokens } => {
                let delay = self.transfer_ms(tokens);
                if delay > 0.0 {
                    self.order += 1;
                    self.transfers
                        .push(Reverse((Time(now + delay), self.order, id)));
                } else {
                    self.transferred(id);
                }
            }
            Action::ActivateDestination => {
                let Some((w, rank)) = self.flight(id).and_then(|f| f.decode_at) else {
                    return true;
                };
                let worker = &mut self.pools[DECODE].workers[w];
                if worker.busy && worker.live.is_none() {
                    self.actions.defer(DECODE, w, id, action);
                    return false;
                }
                self.collector.records[id as usize].destination_activated_ms = Some(now);
                let next = match worker.live.as_mut() {
                    Some(live) => {
                        live.activate(rank, id);
                        None
                    }
                    None => worker.ranks[rank].activate(id),
                };
                let after = self.flight(id).and_then(|f| f.handoff.on_activated());
                self.actions.push(id, after);
                if let Some(r) = next {
                    self.reserved(r, now);
                }
            }
            Action::ReleaseSource => {
                let Some((w, rank)) = self.flight(id).and_then(|f| f.prefill_at) else {
                    return true;
                };
                let worker = &mut self.pools[ENTRY].workers[w];
                if worker.busy && worker.live.is_none() {
                    self.actions.defer(ENTRY, w, id, action);
                    return false;
                }
                worker.release_source(rank, id);
                self.collector.records[id as usize].source_released_ms = Some(now);
                if let Some(slot) = self.in_flight.get_mut(id as usize) {
                    *slot = None;
                }
            }
        }
        true
    }

    /// Picks a decode worker for the request and asks it for room (at once when it is
    /// between passes; otherwise when its pass ends).
    fn reserve_destination(&mut self, id: RequestId, now: f64) {
        let Some(request) = self.flight(id).and_then(|f| f.decode.take()) else {
            return;
        };
        let pool = &mut self.pools[DECODE];
        let too_big =
            u64::from(request.prompt_len.div_ceil(pool.block_size)) > pool.capacity_blocks;
        // Dynamo 1.4.2 refuses such a prompt before it picks a worker; AISimulate's router
        // places it (a round robin moves on) and the worker refuses it.
        let routed_first = self.config.engine.engine_version == EngineVersion::Aisimulate013;
        if too_big && !routed_first {
            self.abandon(id, now);
            return;
        }
        let route = pool
            .router
            .route(id, request.hashes.clone(), request.prompt_len);
        // Its prompt arrives computed: only its decode load counts.
        pool.router.prefill_done(id);
        if too_big {
            self.abandon(id, now);
            return;
        }
        let (w, rank) = (route.candidate / pool.dp, route.candidate % pool.dp);
        let worker = &mut pool.workers[w];
        let reserved = match worker.live.as_mut() {
            Some(live) => {
                live.reserve_destination(rank, request);
                Ok(None)
            }
            None => {
                let between_passes = !worker.busy;
                worker.earliest_end = None;
                worker.ranks[rank].reserve_destination(request, between_passes)
            }
        };
        let record = &mut self.collector.records[id as usize];
        record.decode_worker_idx = Some(route.candidate as u32);
        record.decode_route_overlap_tokens = Some(route.overlap_tokens);
        if let Some(f) = self.flight(id) {
            f.decode_at = Some((w, rank));
        }
        match reserved {
            Ok(Some(r)) => self.reserved(r, now),
            Ok(None) => {}
            Err(_) => {
                // The worker refused it: the request was never that worker's (AISimulate
                // names no decode worker for it).
                self.collector.records[id as usize].decode_worker_idx = None;
                self.abandon(id, now);
            }
        }
    }

    /// A decode worker set room aside for a request's prompt.
    fn reserved(&mut self, r: Reserved, now: f64) {
        self.collector.records[r.id as usize].destination_reserved_ms = Some(now);
        let next = self
            .flight(r.id)
            .and_then(|f| f.handoff.on_reserved(r.missing_tokens));
        self.actions.push(r.id, next);
    }

    /// A request's prompt KV reached its decode worker.
    fn transferred(&mut self, id: RequestId) {
        let next = self.flight(id).and_then(|f| f.handoff.on_transferred());
        self.actions.push(id, next);
    }

    /// A prompt that no decode worker can ever hold: the request ends (rejected, as Dynamo
    /// 1.4.2 has it; failed, as AISimulate's handoff has it) and its prefill copy, if any,
    /// is released.
    fn abandon(&mut self, id: RequestId, now: f64) {
        if let Some(f) = self.in_flight.get_mut(id as usize).and_then(Option::take) {
            if let Some((w, rank)) = f.prefill_at.filter(|_| f.handoff.is_held()) {
                let worker = &mut self.pools[ENTRY].workers[w];
                worker.release_source(rank, id);
            }
        }
        let status = match self.config.engine.engine_version {
            EngineVersion::Dynamo142 => Status::Rejected,
            EngineVersion::Aisimulate013 => Status::Failed,
        };
        self.end_request(DECODE, id, now, status);
    }

    fn turn_of(&self, id: RequestId) -> &super::workload::Turn {
        let session = self.request_session[id as usize];
        let record = &self.collector.records[id as usize];
        &self.workload.sessions[session as usize].turns[record.turn_index as usize]
    }

    /// Milliseconds to move `tokens` of prompt KV to the decode pool: the prefill worker's
    /// link model, zero without one.
    fn transfer_ms(&self, tokens: u32) -> f64 {
        let Some(prefill) = self.config.prefill.as_ref().map(|p| &p.engine) else {
            return 0.0;
        };
        match (prefill.kv_bytes_per_token, prefill.kv_transfer_bandwidth) {
            (Some(b), Some(gbps)) if gbps > 0.0 => {
                f64::from(tokens) * b as f64 / (gbps * 1e9) * 1000.0
            }
            _ => 0.0,
        }
    }

    /// Starts a pass on worker `w` of `pool`; returns when it ends, or `None` when no rank
    /// had anything to do.
    fn start_pass(&mut self, pool: usize, w: usize, now: f64) -> Option<f64> {
        self.pools[pool].workers[w].earliest_end = None;
        // A prefill worker runs no quiet decode passes (`Coast::quiet`).
        let steps = self.coasting.filter(|_| !self.pools[pool].prefill_only);
        if let Some(lead) = steps {
            let before = self.quiet_until(pool, w, now, lead);
            // What reaches a decode worker in the middle of a pass acts where the pass
            // ends (a prompt tried for room, an activation), in the order of the passes
            // that end together: a step, which is ordered where it starts, ends by then.
            let window = match pool {
                DECODE => StepWindow {
                    starts_before: before,
                    ends_by: before,
                },
                _ => StepWindow::before(before),
            };
            if let Some(end) = self.coast(pool, w, now, window) {
                return Some(end);
            }
        }
        // The prompt runs where the store is consulted: the entry pool.
        let use_store = pool == ENTRY;
        if let Some(o) = self.offload.as_deref_mut() {
            o.advance_to(now);
        }
        let disaggregated = self.disaggregated();
        // AISimulate lists a disaggregated request's reuse as its prefill admissions'.
        let prefill_reuse =
            disaggregated && self.prefill_engine_version() != Some(EngineVersion::Dynamo142);
        let worker = &mut self.pools[pool].workers[w];
        let mut longest: Option<f64> = None;
        for (rank, engine) in worker.ranks.iter_mut().enumerate() {
            engine.set_wave_step(worker.wave_step);
            if engine.is_idle() {
                continue;
            }
            let connector = self
                .offload
                .as_deref_mut()
                .filter(|_| use_store)
                .map(|o| o as &mut dyn KvConnector);
            let out = &mut worker.outputs[rank];
            if !engine.pass_into(connector, out) {
                continue;
            }
            for &(id, reused) in &out.admitted {
                self.collector.admit(id, now, reused);
                let record = &mut self.collector.records[id as usize];
                if pool == DECODE {
                    record.decode_admit_ms.get_or_insert(now);
                    let r = record.decode_reused_input_tokens.get_or_insert(reused);
                    *r = (*r).max(reused);
                } else if disaggregated {
                    record.prefill_admit_ms.get_or_insert(now);
                    if prefill_reuse {
                        let r = record.prefill_reused_input_tokens.get_or_insert(reused);
                        *r = (*r).max(reused);
                    }
                }
            }
            let end = out.end_ms(now);
            longest = Some(longest.map_or(end, |l: f64| l.max(end)));
            worker.ran.push(rank);
        }
        let end = longest?;
        worker.wave_step += 1;
        self.passes += 1;
        if end > now {
            worker.busy = true;
            worker.until = end;
            self.order += 1;
            self.completions
                .push(Reverse((Time(end), self.order, pool as u8, w as u32)));
        }
        Some(end)
    }

    /// The time before which no request can reach worker `w` of `pool`, which starts a
    /// pass at `now`: its passes until then are its own business.
    ///
    /// - Of the arrivals made already, the first it gets. Under round robin the workers
    ///   take requests in turn, whatever they hold, so that is the one its turn falls on,
    ///   where no arrival yet to be made comes before it; otherwise (where a request
    ///   graph's arrivals may send nothing, and for a decode worker, whose requests come of
    ///   handoffs) the first.
    /// - `lead` after the earliest a request can end elsewhere, as an arrival yet to be
    ///   made comes of a request's end at least `lead` before it ([`arrival_lead`]; an end
    ///   here comes after the worker's step, which holds none). A worker no request reaches
    ///   ends none before [`Worker::earliest_end`]; one that another arrival reaches first
    ///   may end one from then on.
    /// - For a decode worker of a disaggregated run, the earliest a handoff can reach the
    ///   decode pool, whose router reads every decode worker ([`Simulation::handoff_bound`]).
    ///
    /// The other workers are asked only where the arrivals do not end the step first.
    fn quiet_until(&mut self, pool: usize, w: usize, now: f64, lead: f64) -> f64 {
        let first = self.arrivals.nth(0);
        let turns = match (&self.dependents, pool) {
            (None, ENTRY) => self.pools[pool].router.turns_before(w),
            _ => None,
        };
        let reach = turns.map_or(first, |j| self.arrivals.nth(j));
        let elsewhere = match reach > first {
            true => first + lead,
            false => f64::INFINITY,
        };
        let mut bound = reach.min(elsewhere);
        if pool == DECODE {
            bound = bound.min(self.handoff_bound(now));
        }
        if now + lead >= bound {
            return bound;
        }
        let mut end = f64::INFINITY;
        for (p, other) in self.pools.iter_mut().enumerate() {
            for (v, worker) in other.workers.iter_mut().enumerate() {
                if (p, v) != (pool, w) {
                    let handed = self.actions.waits_on(p, v);
                    end = end.min(worker.earliest_end(now, handed));
                }
            }
        }
        bound.min(end.max(now) + lead)
    }

    /// The earliest a handoff can next reach the decode pool (route a request there, or
    /// reserve, activate or release one on a decode worker), from `now`: at once while
    /// actions wait to run; otherwise when the first transfer completes or the first
    /// prefill pass ends (which may hold a prompt, the rest of whose handoff follows at
    /// once), whichever comes first. A prefill worker between passes with a prompt to run
    /// could start one at once. A destination-first handoff starts at its arrival, which
    /// [`Simulation::quiet_until`] counts; an activation deferred to another decode
    /// worker's pass end counts as that worker ending a request there
    /// ([`Worker::earliest_end`]); the worker that asks, between passes, has none deferred.
    fn handoff_bound(&self, now: f64) -> f64 {
        if !self.actions.is_empty() {
            return now;
        }
        let transfer = self
            .transfers
            .peek()
            .map_or(f64::INFINITY, |Reverse((t, ..))| t.0);
        self.pools[ENTRY]
            .workers
            .iter()
            .map(|worker| worker.next_pass_end(now))
            .fold(transfer, f64::min)
    }

    /// Runs worker `w`'s quiet decode passes from `now`, each within `window` (whose start
    /// bound no request reaches it before, [`Simulation::quiet_until`]), as one step (see
    /// [`Engine::coast_ranks`]), their tokens recorded at once; the step ends with an event that applies nothing, after which the worker's
    /// next pass starts in the loop's order. Returns when the step ends, or `None` when no
    /// pass qualifies.
    fn coast(&mut self, pool: usize, w: usize, now: f64, window: StepWindow) -> Option<f64> {
        let worker = &mut self.pools[pool].workers[w];
        let collector = &mut self.collector;
        let (passes, end) =
            Engine::coast_ranks(&mut worker.ranks, now, window, &mut |id, times| {
                collector.tokens(id, times);
            })?;
        worker.busy = true;
        worker.until = end;
        worker.wave_step += passes;
        self.steps += 1;
        self.passes += passes;
        self.order += 1;
        self.completions
            .push(Reverse((Time(end), self.order, pool as u8, w as u32)));
        Some(end)
    }

    /// A pass of worker `w` ended: the worker may take the destinations it queued and the
    /// actions that waited on it; then the pass's tokens, completions and held sources
    /// apply.
    fn finish_pass(&mut self, pool: usize, w: usize, now: f64) {
        let p = &mut self.pools[pool];
        let (dp, prefill_only) = (p.dp, p.prefill_only);
        let worker = &mut p.workers[w];
        worker.busy = false;
        let retried = worker.retry_destinations();
        let mut ran = std::mem::take(&mut worker.ran);
        let outputs = std::mem::take(&mut worker.outputs);
        self.actions.wake(pool, w);
        let mut held = Vec::new();
        for &rank in &ran {
            let out = &outputs[rank];
            self.collector.prefill_tokens += out.prefill_tokens;
            self.pools[pool]
                .router
                .observe(w * dp + rank, &out.kv_events);
            if prefill_only {
                for &id in &out.held {
                    let router = &mut self.pools[pool].router;
                    router.prefill_done(id);
                    router.free(id);
                }
                held.extend_from_slice(&out.held);
            } else {
                for &(id, done) in &out.emitted {
                    let first = self.collector.records[id as usize].output_length == 0;
                    self.collector.token(id, now);
                    if first {
                        self.pools[pool].router.prefill_done(id);
                    }
                    if done {
                        self.end_request(pool, id, now, Status::Completed);
                    }
                }
            }
            for &id in &out.rejected {
                if let Some(slot) = self.in_flight.get_mut(id as usize) {
                    *slot = None;
                }
                self.end_request(pool, id, now, Status::Rejected);
            }
        }
        ran.clear();
        let worker = &mut self.pools[pool].workers[w];
        worker.ran = ran;
        worker.outputs = outputs;
        worker.settle_wave();
        for id in held {
            self.collector.records[id as usize].source_held_ms = Some(now);
            let next = self.flight(id).and_then(|f| f.handoff.on_held());
            self.actions.push(id, next);
        }
        for r in retried {
            self.reserved(r, now);
        }
    }

    /// A request ended: its session's next turn follows after its delay, or, when the
    /// session is over, what waits for it is released (or, for a rejected request under
    /// AISimulate's engine, skipped) and a closed loop releases the next session.
    fn end_request(&mut self, pool: usize, id: RequestId, now: f64, status: Status) {
        self.collector.finish(id, now, status);
        if let (Some(observer), Some(record)) = (
            &self.config.observer,
            self.collector.records.get(id as usize),
        ) {
            observer.ended(record);
        }
        self.pools[pool].router.free(id);
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
            return;
        }
        let play = self.collector.records[id as usize].play;
        match (self.dependents.as_mut(), play) {
            (Some(d), Some(play)) if status.is_failure() && d.skip_after_rejection => d.fail(play),
            _ => self.release(session, Trigger::Completion, now),
        }
        if let Some(s) = self.waiting_sessions.pop_front() {
            self.schedule_arrival(now, s);
        }
    }

    /// Fires the waits on `session` of kind `trigger`: a session whose last wait fired
    /// arrives once its delay and its own arrival time have passed.
    fn release(&mut self, session: u32, trigger: Trigger, now: f64) {
        let Some(d) = self.dependents.as_mut() else {
            return;
        };
        let list = match trigger {
            Trigger::Dispatch => &mut d.on_dispatch,
            Trigger::Completion => &mut d.on_completion,
        };
        let released = std::mem::take(&mut list[session as usize]);
        for &(target, delay) in &released {
            let t = target as usize;
            d.ready_after[t] = d.ready_after[t].max(now + delay);
            d.remaining[t] -= 1;
            if d.remaining[t] == 0 {
                let at = d.ready_after[t];
                self.arrivals.push(at, target);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::WorkerType;
    use crate::workload::{Graph, Prompt, Session, Turn, Wait};

    fn session(delays: &[f64]) -> Session {
        Session {
            id: None,
            start_ms: 0.0,
            turns: delays
                .iter()
                .map(|&delay_ms| Turn {
                    prompt: Prompt::from_blocks(&[1], 16, 16),
                    output_length: 1,
                    output_content: None,
                    delay_ms,
                    request_id: None,
                    priority: 0,
                    strict_priority: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn the_arrival_lead_is_the_least_delay_an_event_puts_before_an_arrival() {
        let single = Workload {
            sessions: vec![session(&[0.0]), session(&[0.0])],
            ..Workload::default()
        };
        assert_eq!(arrival_lead(&single, None), f64::INFINITY);
        assert_eq!(arrival_lead(&single, Some(8)), 0.0, "a closed loop");
        let turns = Workload {
            sessions: vec![session(&[0.0, 250.0, 40.0]), session(&[0.0, 90.0])],
            ..Workload::default()
        };
        assert_eq!(
            arrival_lead(&turns, None),
            40.0,
            "a first turn's delay is no lead"
        );
        for bad in [-1.0, f64::NAN] {
            let odd = Workload {
                sessions: vec![session(&[0.0, 250.0]), session(&[0.0, bad])],
                ..Workload::default()
            };
            assert_eq!(arrival_lead(&odd, None), 0.0, "{bad}");
        }
        let wait = |delay_ms| Wait {
            on: 0,
            trigger: Trigger::Completion,
            delay_ms,
        };
        let graph = Workload {
            sessions: vec![session(&[0.0]), session(&[0.0]), session(&[0.0])],
            graph: Some(Graph {
                waits: vec![vec![], vec![wait(30.0)], vec![wait(12.5), wait(70.0)]],
                plays: vec![0; 3],
                play_names: vec!["p".into()],
                identity: None,
            }),
            ..Workload::default()
        };
        assert_eq!(arrival_lead(&graph, None), 12.5);
    }

    /// A random workload of 4 to 23 sessions starting within 400 ms: a third single turns
    /// only (every arrival known from the start), the rest up to four turns each, some
    /// without a delay; half the prompts open with one of two shared blocks, some answers
    /// short enough to end within a few passes.
    fn random_sessions(draw: &mut impl FnMut(u32) -> u32, block_size: u32) -> Workload {
        let most_turns = [1, 4, 4][draw(3) as usize];
        let sessions = (0..4 + draw(20))
            .map(|s| Session {
                id: None,
                start_ms: f64::from(draw(400)),
                turns: (0..1 + draw(most_turns))
                    .map(|_| {
                        let len = 10 + draw(300);
                        let first = [draw(2), 1000 + s][draw(2) as usize];
                        let most = [4, 120][draw(2) as usize];
                        Turn {
                            prompt: Prompt::from_blocks(&[first], block_size, len),
                            output_length: 1 + draw(most),
                            output_content: None,
                            delay_ms: [0.0, 0.0, 3.5, 40.0][draw(4) as usize],
                            request_id: None,
                            priority: 0,
                            strict_priority: 0,
                        }
                    })
                    .collect(),
            })
            .collect();
        Workload {
            sessions,
            ..Workload::default()
        }
    }

    /// A run of `workers` workers of `engine` (and `prefill`) under a router and an arrival
    /// loop drawn at random: either router, open loop or two or six sessions at a time.
    fn random_config(
        engine: EngineArgs,
        workers: u32,
        prefill: Option<PrefillPool>,
        draw: &mut impl FnMut(u32) -> u32,
    ) -> SimConfig {
        SimConfig {
            engine,
            workers,
            prefill,
            router: match draw(2) {
                0 => RouterMode::RoundRobin,
                _ => RouterMode::KvRouter(KvRouterConfig::default()),
            },
            concurrency: [None, Some(2), Some(6)][draw(3) as usize],
            seed: 7,
            online: false,
            observer: None,
        }
    }

    /// Runs `config` one pass at a time and in steps: the two must give the same records
    /// and passes. Returns how many steps ran.
    fn steps_change_nothing(workload: &Workload, config: &SimConfig, case: &str) -> u64 {
        let run = |with_steps| {
            let (result, steps) =
                run_simulation(workload, config, None, &mut |_, _| {}, with_steps).expect("a run");
            let records: Vec<String> = result
                .collector
                .records
                .iter()
                .map(|r| format!("{r:?}"))
                .collect();
            (records, result.passes, steps)
        };
        let (one_by_one, passes, _) = run(false);
        let (stepped, stepped_passes, steps) = run(true);
        if let Some((a, b)) = one_by_one.iter().zip(&stepped).find(|(a, b)| a != b) {
            panic!("{case}: a record differs\none pass at a time: {a}\nin steps: {b}");
        }
        assert_eq!(one_by_one.len(), stepped.len(), "{case}");
        assert_eq!(passes, stepped_passes, "{case}");
        steps
    }

    #[test]
    fn workers_step_up_to_the_earliest_end_another_worker_can_make() {
        // Several workers, where a request's end makes an arrival at once (turns without a
        // delay, a closed loop): each steps as far as no other worker can end a request,
        // and under round robin past the arrivals that go to other workers. Random
        // workloads (a fixed seed) on the three engines under both references'
        // schedulers, one or two attention-DP ranks, pools from tight to roomy, both
        // routers; every record must be the one a run of single passes gives.
        let mut rng = crate::rng::SplitMix64::new(0x2545_F491_4F6C_DD1D);
        let mut draw = |m: u32| rng.range(0, u64::from(m) - 1) as u32;
        let (mut steps, mut runs) = (0, 0);
        for workload in 0..120 {
            let engine_type =
                [EngineType::Sglang, EngineType::Vllm, EngineType::Trtllm][draw(3) as usize];
            let engine_version =
                [EngineVersion::Dynamo142, EngineVersion::Aisimulate013][draw(2) as usize];
            let block_size = [16, 32][draw(2) as usize];
            let dp_size = 1 + draw(2);
            let engine = EngineArgs {
                engine_type,
                engine_version,
                block_size,
                dp_size,
                prefill_schedule_interval: 1 + draw(2),
                num_gpu_blocks: [40, 120, 16384][draw(3) as usize],
                ..EngineArgs::default()
            };
            let workload_ = random_sessions(&mut draw, block_size);
            let config = random_config(engine, 2 + draw(3), None, &mut draw);
            let case = format!("workload {workload}: {:?}", config.engine);
            steps += steps_change_nothing(&workload_, &config, &case);
            runs += 1;
        }
        assert!(steps > 1_000, "{steps} steps over {runs} runs");
    }

    #[test]
    fn decode_workers_step_up_to_the_next_handoff() {
        // Disaggregated: a decode worker steps as far as no handoff can reach the decode
        // pool (a prompt arrives, a prefill pass ends, a transfer completes) and no other
        // worker can end a request, beside the prompts reserved room on it that wait for
        // their transfer. Random workloads on the three engines (TRT-LLM under AISimulate's
        // scheduler only, as Dynamo 1.4.2 refuses it disaggregated), one to three workers a
        // pool, one or two ranks, transfers instant, fast and slow, of the whole prompt or
        // what the decode worker lacks, decode pools from too small for some prompts to
        // roomy, open and closed loops; every record must be the one a run of single
        // passes gives.
        let mut rng = crate::rng::SplitMix64::new(0x9E37_79B9_7F4A_7C15);
        let mut draw = |m: u32| rng.range(0, u64::from(m) - 1) as u32;
        let (mut steps, mut runs) = (0, 0);
        for workload in 0..240 {
            let engine_type =
                [EngineType::Sglang, EngineType::Vllm, EngineType::Trtllm][draw(3) as usize];
            let engine_version = match engine_type {
                EngineType::Trtllm => EngineVersion::Aisimulate013,
                _ => [EngineVersion::Dynamo142, EngineVersion::Aisimulate013][draw(2) as usize],
            };
            let block_size = [16, 32][draw(2) as usize];
            let mut engine = |worker_type| EngineArgs {
                engine_type,
                engine_version,
                worker_type,
                block_size,
                dp_size: 1 + draw(2),
                num_gpu_blocks: [12, 40, 120, 16384][draw(4) as usize],
                ..EngineArgs::default()
            };
            let decode = engine(WorkerType::Decode);
            let mut prefill = engine(WorkerType::Prefill);
            // Prefill pools from one prompt's room up, transfers that keep prompts held.
            prefill.num_gpu_blocks = [24, 40, 120][draw(3) as usize];
            prefill.kv_bytes_per_token = Some(131_072);
            prefill.kv_transfer_bandwidth =
                [None, Some(0.05), Some(0.5), Some(20.0)][draw(4) as usize];
            prefill.kv_transfer_timing = [
                TransferTiming::FullPrompt,
                TransferTiming::DestinationMissing,
            ][draw(2) as usize];
            let workload_ = random_sessions(&mut draw, block_size);
            let prefill = PrefillPool {
                engine: prefill,
                workers: 1 + draw(2),
            };
            let config = random_config(decode, 1 + draw(3), Some(prefill), &mut draw);
            let case = format!("workload {workload}: {:?}", config.prefill);
            steps += steps_change_nothing(&workload_, &config, &case);
            runs += 1;
        }
        assert!(steps > 1_000, "{steps} steps over {runs} runs");
    }

    #[test]
    fn decode_workers_step_through_a_mooncake_slice_as_its_passes_one_by_one() {
        // The first 300 requests of Mooncake's conversation trace, 20× faster, in closed
        // loops: prompts of thousands of tokens held on small prefill pools while their KV
        // moves, so that a transfer often completes during a decode worker's pass and its
        // activation waits for the pass to end; the request it brings may end within a
        // few passes, and the closed loop sends the next at once. A step elsewhere must
        // count that end among the ones it waits for.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/mooncake/conversation_head300.jsonl"
        );
        let file = std::fs::File::open(path).expect("the bundled slice");
        let mut workload =
            crate::mooncake::read_mooncake(std::io::BufReader::new(file), 512).expect("a trace");
        workload.speed_up_arrivals(20.0);
        let mut steps = 0;
        for (engine_type, prefill_dp, decode_blocks, concurrency) in [
            (EngineType::Trtllm, 3, 1500, 20),
            (EngineType::Trtllm, 2, 16384, 6),
            (EngineType::Vllm, 3, 1500, 20),
            (EngineType::Sglang, 2, 1500, 20),
        ] {
            let engine = |worker_type, dp_size, num_gpu_blocks| EngineArgs {
                engine_type,
                engine_version: EngineVersion::Aisimulate013,
                worker_type,
                block_size: 512,
                dp_size,
                num_gpu_blocks,
                ..EngineArgs::default()
            };
            let mut prefill = engine(WorkerType::Prefill, prefill_dp, 37);
            prefill.kv_bytes_per_token = Some(131_072);
            prefill.kv_transfer_bandwidth = Some(20.0);
            let config = SimConfig {
                engine: engine(WorkerType::Decode, 1, decode_blocks),
                workers: 2,
                prefill: Some(PrefillPool {
                    engine: prefill,
                    workers: 2,
                }),
                router: RouterMode::RoundRobin,
                concurrency: Some(concurrency),
                seed: 7,
                online: false,
                observer: None,
            };
            let case =
                format!("{engine_type:?}, prefill dp {prefill_dp}, decode pool {decode_blocks}");
            steps += steps_change_nothing(&workload, &config, &case);
        }
        assert!(steps > 1_000, "{steps} steps");
    }

    #[test]
    fn decode_steps_end_by_the_pass_a_handoff_reaches() {
        // Fifty identical three-turn sessions, ten at a time: the two decode workers run
        // in lockstep, their passes ending together. A prompt that reaches a busy decode
        // worker is tried for room where its pass ends, and the two workers' tries go in
        // the order their passes were started; a step, ordered where it starts, must end
        // by the pass the prompt reaches, or the tries, and so the prefill ranks of the
        // prompts, swap.
        let workload = crate::workload::SyntheticSpec {
            input_tokens: 500,
            output_tokens: 200,
            count: 50,
            turns: 3,
            shared_prefix_ratio: 0.0,
            prefix_groups: 0,
            inter_turn_delay_ms: 50.0,
            block_size: 16,
            arrivals: crate::workload::SyntheticArrivals::Burst,
            seed: 42,
            carry_history: false,
        }
        .build();
        let engine = |worker_type, dp_size| EngineArgs {
            engine_type: EngineType::Sglang,
            engine_version: EngineVersion::Dynamo142,
            worker_type,
            block_size: 16,
            dp_size,
            num_gpu_blocks: 12_000,
            ..EngineArgs::default()
        };
        let mut prefill = engine(WorkerType::Prefill, 2);
        prefill.kv_bytes_per_token = Some(131_072);
        prefill.kv_transfer_bandwidth = Some(20.0);
        let config = SimConfig {
            engine: engine(WorkerType::Decode, 1),
            workers: 2,
            prefill: Some(PrefillPool {
                engine: prefill,
                workers: 2,
            }),
            router: RouterMode::RoundRobin,
            concurrency: Some(10),
            seed: 7,
            online: false,
            observer: None,
        };
        let steps = steps_change_nothing(&workload, &config, "lockstep sessions");
        assert!(steps > 100, "{steps} steps");
    }
}
