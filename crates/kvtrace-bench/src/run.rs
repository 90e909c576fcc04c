//! A benchmark run: user threads think and submit requests to a priority queue (QoS first,
//! then arrival), worker threads serve them with real I/O through the tier cache, and the
//! run stops cleanly at its deadline (or after its request count), counting only what
//! completed before it.
//!
//! Each user waits for its request to complete before thinking about the next one, as a
//! person at a chat window does, so the offered load is the number of users and never an
//! unbounded queue; a multi-turn conversation's earlier turns are therefore written before
//! the next turn reads them.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::autoscale::{AutoscaleConfig, AutoscaleMode, Autoscaler, Decision, ScaleEvent, Window};
use super::burst::{BurstReplay, BurstStream};
use super::calls::CallTrace;
use super::io::{IoBuffer, IoTime};
use super::metrics::{percentile, Category, Collected, Metrics, RequestSample};
use super::models::ModelConfig;
use super::rag::Corpus;
use super::sharegpt::{Dataset, DatasetStream};
use super::spans::Trail;
use super::tiers::{Access, Allocation, TierCache};
use super::users::{PersonaSet, Phase, Request, UserStream};

/// What a request reads back while decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeReads {
    /// The whole entry once, then once more per 32 generated tokens (kv-cache.py's stress
    /// pattern).
    Amplified,
    /// The whole entry once, as an engine that decodes from HBM would.
    Single,
}

/// Which earlier turns a new turn reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultiTurn {
    Off,
    /// Every earlier turn of the conversation.
    AllPrevious,
    /// Only the turn before.
    PreviousOnly,
}

/// Worker threads never exceed this many.
pub const MAX_WORKERS: u32 = 500;

/// Generated tokens per decode-read batch.
const DECODE_BATCH: u64 = 32;

#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub model: ModelConfig,
    pub users: u32,
    /// Worker threads serving the queue.
    pub workers: u32,
    pub duration: Duration,
    /// Stop after this many completed requests (0: no limit).
    pub max_requests: u64,
    pub seed: u64,
    pub personas: PersonaSet,
    pub multi_turn: MultiTurn,
    pub prefix_caching: bool,
    /// Tokens of each shared system prompt.
    pub system_prompt_tokens: [u64; 3],
    /// Milliseconds slept per generated token (0, 2 or 30).
    pub generation_ms_per_token: f64,
    pub decode_reads: DecodeReads,
    /// Entry writes in flight at once (0: unlimited).
    pub max_concurrent_allocs: u32,
    /// Entries are split over this many GPUs; one rank's share is stored.
    pub tensor_parallel: u32,
    pub autoscale: Option<AutoscaleConfig>,
    /// ShareGPT conversations instead of persona users' synthetic requests.
    pub dataset: Option<Arc<Dataset>>,
    /// A BurstGPT log replayed at its times divided by the speedup (0: no waiting).
    pub burst: Option<BurstReplay>,
    /// Passes over the dataset or log (0: until the run ends).
    pub replay_cycles: u32,
    /// Submissions per second over all users (0: no pacing).
    pub request_rate: f64,
    /// Documents ingested at the start and retrieved by one request in ten.
    pub rag: Option<Corpus>,
    /// Put before the names of users' entries (and request ids): in rank mode
    /// `rank-00003/`, so ranks sharing a tier never take each other's conversations for
    /// their own; system prompts and documents stay unscoped, shared by every rank.
    pub user_scope: String,
}

/// Where a user's requests come from.
enum Source {
    Synthetic(UserStream),
    Dataset(DatasetStream),
    Burst(BurstStream),
}

impl Source {
    fn new(c: &BenchConfig, user: u32, users: u32) -> Source {
        let synthetic = UserStream::new(c.seed, user, c.personas, c.multi_turn != MultiTurn::Off);
        let qos = synthetic.profile().qos;
        match (&c.dataset, &c.burst) {
            (Some(d), _) => Source::Dataset(DatasetStream::new(
                Arc::clone(d),
                c.seed,
                user,
                users,
                qos,
                c.replay_cycles,
            )),
            (None, Some(b)) => Source::Burst(BurstStream::new(
                Arc::clone(&b.rows),
                user,
                users,
                qos,
                b.speedup,
                c.replay_cycles,
            )),
            (None, None) => Source::Synthetic(synthetic),
        }
    }

    fn next_request(&mut self) -> Option<Request> {
        match self {
            Source::Synthetic(s) => Some(s.next_request()),
            Source::Dataset(d) => d.next_request(),
            Source::Burst(b) => b.next_request(),
        }
    }
}

/// One autoscaler window, for the throughput timeline.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TimelinePoint {
    pub t_s: f64,
    /// User threads alive at the end of the window.
    pub live_users: u32,
    pub tokens_per_s: f64,
    pub read_p95_ms: f64,
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub collected: Collected,
    /// Seconds from start to the deadline (or to the last counted completion).
    pub elapsed_s: f64,
    /// Requests that finished after the deadline and were not counted.
    pub late: u64,
    pub timeline: Vec<TimelinePoint>,
    pub scale_events: Vec<ScaleEvent>,
    /// Capacity mode: the user count with the best throughput, and that throughput.
    pub peak: Option<(u32, f64)>,
    pub final_users: u32,
    /// A signal stopped the run before its deadline.
    pub interrupted: bool,
}

struct Queued {
    priority: u8,
    order: u64,
    submitted: Instant,
    request: Request,
    done: Arc<(Mutex<bool>, Condvar)>,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.priority, self.order) == (other.priority, other.order)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    /// Higher priority first, then earlier submission.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.priority
            .cmp(&other.priority)
            .then(other.order.cmp(&self.order))
    }
}

/// The request queue.
#[derive(Default)]
struct Queue {
    heap: Mutex<BinaryHeap<Queued>>,
    ready: Condvar,
}

/// A counting semaphore for `--max-concurrent-allocs`.
struct Permits {
    free: Mutex<u32>,
    released: Condvar,
    limited: bool,
}

impl Permits {
    fn acquire(&self) {
        if !self.limited {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.released.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
    }

    fn release(&self) {
        if self.limited {
            *self.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            self.released.notify_one();
        }
    }
}

struct Shared<'a> {
    config: &'a BenchConfig,
    cache: &'a TierCache,
    calls: &'a CallTrace,
    metrics: &'a Metrics,
    queue: Queue,
    permits: Permits,
    /// Set at the deadline; worker I/O checks it between chunks.
    stop: Arc<AtomicBool>,
    deadline: Instant,
    late: AtomicU64,
    order: AtomicU64,
    /// Users with an id below this run; the others end their thread.
    active_users: AtomicU32,
    live_users: AtomicU32,
    /// Per user id: a thread is running it.
    alive: Vec<AtomicBool>,
    began: Instant,
    /// Submissions paced so far (`request_rate`).
    paced: AtomicU64,
}

/// Stacks of user threads (they only think and wait) and workers (their buffers are on
/// the heap): small, so thousands of users fit.
const USER_STACK: usize = 64 << 10;
const WORKER_STACK: usize = 256 << 10;

/// Runs the benchmark; `progress(elapsed_s, completed)` is called about once a second.
/// Fails only when the threads cannot be started.
pub fn run(
    config: &BenchConfig,
    cache: &TierCache,
    calls: &CallTrace,
    progress: &mut (dyn FnMut(f64, u64) + Send),
) -> kvtrace_io::Result<RunOutcome> {
    let metrics = Metrics::default();
    let began = Instant::now();
    let shared = Shared {
        config,
        cache,
        calls,
        metrics: &metrics,
        queue: Queue::default(),
        permits: Permits {
            free: Mutex::new(config.max_concurrent_allocs),
            released: Condvar::new(),
            limited: config.max_concurrent_allocs > 0,
        },
        stop: Arc::new(AtomicBool::new(false)),
        deadline: began + config.duration,
        late: AtomicU64::new(0),
        order: AtomicU64::new(0),
        active_users: AtomicU32::new(config.users),
        live_users: AtomicU32::new(0),
        alive: (0..config
            .users
            .max(config.autoscale.map_or(0, |a| a.max_users)))
            .map(|_| AtomicBool::new(false))
            .collect(),
        began,
        paced: AtomicU64::new(0),
    };
    let mut autoscaler = config.autoscale.map(Autoscaler::new);
    let mut timeline = Vec::new();
    let mut stopped_early = false;
    let mut interrupted = false;
    let mut spawn_error: Option<std::io::Error> = None;
    std::thread::scope(|scope| {
        let shared = &shared;
        let spawn_worker = |w: u32| {
            std::thread::Builder::new()
                .name(format!("kvtrace-bench-worker-{w}"))
                .stack_size(WORKER_STACK)
                .spawn_scoped(scope, move || worker(shared))
                .map(drop)
        };
        let spawn_user = |u: u32| {
            if shared.alive[u as usize].swap(true, Ordering::SeqCst) {
                // Still running: it sees the higher user count and stays.
                return Ok(());
            }
            shared.live_users.fetch_add(1, Ordering::SeqCst);
            let spawned = std::thread::Builder::new()
                .name(format!("kvtrace-bench-user-{u}"))
                .stack_size(USER_STACK)
                .spawn_scoped(scope, move || {
                    let mut stream = Source::new(shared.config, u, shared.config.users);
                    loop {
                        user(shared, u, &mut stream);
                        shared.alive[u as usize].store(false, Ordering::SeqCst);
                        // A scale-up may have come while this thread was leaving.
                        let wanted = !shared.stop.load(Ordering::SeqCst)
                            && u < shared.active_users.load(Ordering::SeqCst);
                        if !wanted || shared.alive[u as usize].swap(true, Ordering::SeqCst) {
                            break;
                        }
                    }
                    shared.live_users.fetch_sub(1, Ordering::SeqCst);
                });
            if spawned.is_err() {
                shared.alive[u as usize].store(false, Ordering::SeqCst);
                shared.live_users.fetch_sub(1, Ordering::SeqCst);
            }
            spawned.map(drop)
        };
        let mut started: std::io::Result<()> = Ok(());
        if let Some(corpus) = &config.rag {
            started = std::thread::Builder::new()
                .name("kvtrace-bench-rag-ingest".into())
                .spawn_scoped(scope, move || {
                    let mut buf = IoBuffer::with_cancel(Arc::clone(&shared.stop));
                    for (doc, chunk, tokens) in corpus.chunks() {
                        if shared.stopped() {
                            return;
                        }
                        let mut untraced = Trail::new(false, Instant::now());
                        let name = format!("rag_{doc}_chunk_{chunk}");
                        shared.write(&name, tokens, &mut buf, &mut untraced);
                    }
                })
                .map(drop);
        }
        let mut workers = config.workers.max(1);
        started = started
            .and_then(|()| (0..workers).try_for_each(spawn_worker))
            .and_then(|()| (0..config.users).try_for_each(spawn_user));
        if let Err(e) = started {
            spawn_error = Some(e);
            shared.stop.store(true, Ordering::SeqCst);
        }
        let mut mark = (0, 0);
        let mut next_window = autoscaler
            .as_ref()
            .map(|a| began + Duration::from_secs_f64(a.interval_s()));
        while !shared.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            let now = Instant::now();
            let done = metrics.completed();
            progress(now.duration_since(began).as_secs_f64(), done);
            let due = next_window.is_some_and(|t| now >= t);
            if let Some(a) = autoscaler.as_mut().filter(|_| due) {
                next_window = Some(now + Duration::from_secs_f64(a.interval_s()));
                let users = shared.active_users.load(Ordering::SeqCst);
                let (tokens, mut reads) = metrics.window(&mut mark);
                reads.iter_mut().for_each(|r| *r *= 1e3);
                reads.sort_by(f64::total_cmp);
                let window = Window {
                    t_s: now.duration_since(began).as_secs_f64(),
                    users,
                    tokens_per_s: tokens as f64 / a.interval_s(),
                    read_p95_ms: percentile(&reads, 95.0),
                };
                match a.decide(&window) {
                    Decision::Keep => {}
                    Decision::Stop => {
                        stopped_early = true;
                        shared.stop.store(true, Ordering::SeqCst);
                    }
                    Decision::Scale(to) => {
                        shared.active_users.store(to, Ordering::SeqCst);
                        // A thread that cannot start leaves the user count short; the
                        // timeline shows the live threads.
                        let _ = (users..to).try_for_each(spawn_user);
                        while workers < to.min(MAX_WORKERS) && spawn_worker(workers).is_ok() {
                            workers += 1;
                        }
                    }
                }
                timeline.push(TimelinePoint {
                    t_s: window.t_s,
                    live_users: shared.live_users.load(Ordering::SeqCst),
                    tokens_per_s: window.tokens_per_s,
                    read_p95_ms: window.read_p95_ms,
                });
            }
            let enough = config.max_requests > 0 && done >= config.max_requests;
            if kvtrace_io::interrupt::requested().is_some() {
                interrupted = true;
                stopped_early = true;
            }
            if now >= shared.deadline || enough || interrupted {
                shared.stop.store(true, Ordering::SeqCst);
            }
        }
        shared.queue.ready.notify_all();
    });
    if let Some(e) = spawn_error {
        return Err(kvtrace_io::Error::io(
            "cannot start the benchmark's threads (fewer users or worker threads?)",
            e,
        ));
    }
    let collected = metrics.take();
    let limit_reached =
        config.max_requests > 0 && collected.requests.len() as u64 >= config.max_requests;
    let elapsed_s = if limit_reached || stopped_early {
        began
            .elapsed()
            .as_secs_f64()
            .min(config.duration.as_secs_f64())
    } else {
        config.duration.as_secs_f64()
    };
    Ok(RunOutcome {
        collected,
        elapsed_s,
        late: shared.late.load(Ordering::SeqCst),
        timeline,
        peak: autoscaler
            .as_ref()
            .filter(|a| a.mode() == AutoscaleMode::Capacity)
            .map(Autoscaler::peak),
        scale_events: autoscaler.map(|a| a.events).unwrap_or_default(),
        final_users: shared.active_users.load(Ordering::SeqCst),
        interrupted,
    })
}

/// A user: think, submit, wait for the answer, repeat until the run stops or the user
/// count drops below this user.
fn user(shared: &Shared<'_>, id: u32, stream: &mut Source) {
    while !shared.stop.load(Ordering::Relaxed) && id < shared.active_users.load(Ordering::SeqCst) {
        let Some(request) = stream.next_request() else {
            return;
        };
        if !sleep_unless_stopped(shared, Duration::from_secs_f64(request.think_s)) {
            return;
        }
        if let Some(at) = request.at_s {
            if !sleep_unless_stopped(shared, wait_until(shared, at)) {
                return;
            }
        }
        if shared.config.request_rate > 0.0 {
            // The n-th submission of the run waits for its slot at n / rate seconds.
            let n = shared.paced.fetch_add(1, Ordering::SeqCst);
            let at = n as f64 / shared.config.request_rate;
            if !sleep_unless_stopped(shared, wait_until(shared, at)) {
                return;
            }
        }
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        {
            let mut heap = shared.queue.heap.lock().unwrap_or_else(|p| p.into_inner());
            heap.push(Queued {
                priority: request.qos.priority(),
                order: shared.order.fetch_add(1, Ordering::Relaxed),
                submitted: Instant::now(),
                request,
                done: Arc::clone(&done),
            });
        }
        shared.queue.ready.notify_one();
        let (lock, cv) = &*done;
        let mut finished = lock.lock().unwrap_or_else(|p| p.into_inner());
        while !*finished && !shared.stop.load(Ordering::Relaxed) {
            finished = cv
                .wait_timeout(finished, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The wait until `secs` after the run began; [`Duration::MAX`] for a time past what the
/// clock holds (a `--request-rate` of 1e-300, a trace slowed as much), which the run's end
/// comes before.
fn wait_until(shared: &Shared<'_>, secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs)
        .ok()
        .and_then(|d| shared.began.checked_add(d))
        .map_or(Duration::MAX, |due| {
            due.saturating_duration_since(Instant::now())
        })
}

/// Sleeps in short steps; `false` when the run stopped meanwhile.
fn sleep_unless_stopped(shared: &Shared<'_>, d: Duration) -> bool {
    let until = Instant::now().checked_add(d);
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = match until {
            Some(until) => until.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        };
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

fn worker(shared: &Shared<'_>) {
    let mut buf = IoBuffer::with_cancel(Arc::clone(&shared.stop));
    loop {
        let next = {
            let mut heap = shared.queue.heap.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                if let Some(q) = heap.pop() {
                    break q;
                }
                heap = shared
                    .queue
                    .ready
                    .wait_timeout(heap, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        };
        match serve(shared, &next, &mut buf) {
            Some(sample) if Instant::now() <= shared.deadline => shared.metrics.request(sample),
            _ => {
                shared.late.fetch_add(1, Ordering::Relaxed);
            }
        }
        let (lock, cv) = &*next.done;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_one();
    }
}

/// Time spent on storage by one request, split by phase.
#[derive(Default)]
struct Spent {
    prefill_s: f64,
    decode_s: f64,
}

impl Shared<'_> {
    /// Counts an I/O failure; one cut short by the deadline is not a failure.
    fn io_failed(&self, e: &std::io::Error) {
        if e.kind() != std::io::ErrorKind::Interrupted {
            self.metrics.io_error(e);
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Looks an entry up and reads it where it lives.
    fn read(
        &self,
        name: &str,
        category: Category,
        request: &str,
        buf: &mut IoBuffer,
        trail: &mut Trail,
    ) -> Option<IoTime> {
        let began = trail.now();
        match self.cache.access(self.calls.key_id(name), buf) {
            Ok(Access::Hit { tier, time, size }) => {
                self.calls.read(name, request, Some(size));
                self.metrics.lookup(category, true);
                self.metrics.op(tier, false, time);
                let prefill = category != Category::User;
                let found = Some((tier, self.calls.tokens(size)));
                trail.read(began, category.name(), found, prefill);
                Some(time)
            }
            Ok(Access::Miss) => {
                self.calls.read(name, request, None);
                self.metrics.lookup(category, false);
                trail.read(began, category.name(), None, false);
                None
            }
            Err(e) => {
                self.io_failed(&e);
                trail.read(began, category.name(), None, false);
                None
            }
        }
    }

    /// Writes a new entry (nothing if it exists); the write time.
    fn write(&self, name: &str, tokens: u64, buf: &mut IoBuffer, trail: &mut Trail) -> f64 {
        let began = trail.now();
        let key = self.calls.key_id(name);
        let bytes = self.calls.entry_bytes(tokens);
        self.permits.acquire();
        let result = self.cache.allocate(key, bytes, key.0 as u64, buf, || {
            self.calls.write(name, tokens, true)
        });
        self.permits.release();
        if !matches!(result, Ok(Allocation::Written { .. })) {
            self.calls.write(name, tokens, false);
        }
        let landed = match &result {
            Ok(Allocation::Written { tier, .. }) => Some(*tier),
            _ => None,
        };
        trail.write(began, tokens, landed);
        match result {
            Ok(Allocation::Written { tier, time }) => {
                self.metrics.op(tier, true, time);
                time.total_s()
            }
            Ok(Allocation::Existing { .. }) => 0.0,
            Ok(Allocation::NoRoom) => {
                self.metrics.no_room();
                0.0
            }
            Err(e) => {
                self.io_failed(&e);
                0.0
            }
        }
    }
}

fn turn_name(scope: &str, r: &Request, turn: u32) -> String {
    format!("{scope}conv_{}_{}_turn_{}", r.user, r.conversation, turn)
}

/// Serves one request: shared prefix, earlier turns, the prompt's KV, decode reads, then
/// the generation time. `None` when the run stopped first: the request is abandoned between
/// two operations, so shutdown never waits for a long decode.
fn serve(shared: &Shared<'_>, q: &Queued, buf: &mut IoBuffer) -> Option<RequestSample> {
    let c = shared.config;
    let r = &q.request;
    let mut spent = Spent::default();
    let request = format!(
        "{}user{}-conv{}-turn{}",
        c.user_scope, r.user, r.conversation, r.turn
    );
    let spans = shared.calls.spans();
    let mut trail = Trail::new(spans.is_some(), q.submitted);
    let mut context = r.context_tokens;
    if let (true, Some(p)) = (c.prefix_caching, r.system_prompt) {
        let tokens = c.system_prompt_tokens[usize::from(p) % 3];
        let name = format!("system_prompt_{p}");
        match shared.read(&name, Category::SystemPrompt, &request, buf, &mut trail) {
            Some(t) => {
                spent.prefill_s += t.total_s();
                shared
                    .metrics
                    .prefix_saved(shared.calls.entry_bytes(tokens));
            }
            None => spent.prefill_s += shared.write(&name, tokens, buf, &mut trail),
        }
        context = context.saturating_sub(tokens).max(1);
    }
    if r.turn > 1 {
        let first = match c.multi_turn {
            MultiTurn::AllPrevious => 1,
            MultiTurn::PreviousOnly => r.turn - 1,
            MultiTurn::Off => r.turn,
        };
        for turn in first..r.turn {
            if shared.stopped() {
                return None;
            }
            if let Some(t) = shared.read(
                &turn_name(&c.user_scope, r, turn),
                Category::MultiTurn,
                &request,
                buf,
                &mut trail,
            ) {
                spent.prefill_s += t.total_s();
            }
        }
    }
    let retrieval = c.rag.as_ref().and_then(|corpus| {
        corpus.retrieval(
            c.seed,
            [u64::from(r.user), r.conversation, u64::from(r.turn)],
        )
    });
    if let Some((doc, chunks)) = retrieval {
        for chunk in chunks {
            if shared.stopped() {
                return None;
            }
            let name = format!("rag_{doc}_chunk_{chunk}");
            if let Some(t) = shared.read(&name, Category::Rag, &request, buf, &mut trail) {
                spent.prefill_s += t.total_s();
            }
        }
    }
    let own = turn_name(&c.user_scope, r, r.turn);
    if shared.stopped() {
        return None;
    }
    spent.prefill_s += shared.write(&own, context, buf, &mut trail);
    if r.phase == Phase::PrefillDecode {
        match shared.read(&own, Category::User, &request, buf, &mut trail) {
            Some(t) => {
                spent.decode_s += t.total_s();
                if c.decode_reads == DecodeReads::Amplified {
                    for _ in 0..r.generation_tokens.div_ceil(DECODE_BATCH) {
                        if shared.stopped() {
                            return None;
                        }
                        if let Some(t) =
                            shared.read(&own, Category::User, &request, buf, &mut trail)
                        {
                            spent.decode_s += t.total_s();
                        }
                    }
                }
            }
            None => spent.decode_s += shared.write(&own, context, buf, &mut trail),
        }
    }
    let generation_s = r.generation_tokens as f64 * c.generation_ms_per_token / 1e3;
    let began = trail.now();
    if !sleep_unless_stopped(shared, Duration::from_secs_f64(generation_s)) {
        return None;
    }
    if let Some(sink) = spans {
        trail.generation(began);
        sink.request(trail.finish(&request, context));
    }
    Some(RequestSample {
        qos: r.qos,
        e2e_s: q.submitted.elapsed().as_secs_f64(),
        storage_s: spent.prefill_s + spent.decode_s,
        generation_s,
        prefill_s: spent.prefill_s,
        decode_s: spent.decode_s,
        tokens: r.generation_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscale::{AutoscaleConfig, AutoscaleMode};
    use crate::models::model;
    use crate::tiers::{TierKind, TierSpec, TierStore};

    fn config(users: u32, duration_ms: u64) -> BenchConfig {
        BenchConfig {
            model: *model("tiny-1b").expect("model"),
            users,
            workers: users,
            duration: Duration::from_millis(duration_ms),
            max_requests: 0,
            seed: 3,
            personas: PersonaSet::Current,
            multi_turn: MultiTurn::AllPrevious,
            prefix_caching: true,
            system_prompt_tokens: [512, 1024, 2048],
            generation_ms_per_token: 0.0,
            decode_reads: DecodeReads::Amplified,
            max_concurrent_allocs: 2,
            tensor_parallel: 1,
            autoscale: None,
            dataset: None,
            burst: None,
            replay_cycles: 0,
            request_rate: 0.0,
            rag: None,
            user_scope: String::new(),
        }
    }

    fn no_calls() -> CallTrace {
        CallTrace::new(kvtrace_cache::bus::Tracer::disabled(), "tiny-1b", 24_576)
    }

    fn null_cache() -> TierCache {
        TierCache::new(vec![TierSpec {
            kind: TierKind::Storage,
            capacity: None,
            store: TierStore::Null,
        }])
        .expect("tiers")
    }

    #[test]
    fn shared_prefixes_are_written_once_and_hit_afterwards() {
        let cache = null_cache();
        let out = run(&config(40, 2500), &cache, &no_calls(), &mut |_, _| {}).expect("run");
        let (hits, misses) = out.collected.hits[&Category::SystemPrompt];
        assert!(hits > 0, "later requests hit the shared prefixes");
        assert!(
            misses <= 3 * 40,
            "a prompt misses only until its first write lands: {misses} misses, {hits} hits"
        );
        assert!(hits > misses, "{hits} hits, {misses} misses");
        assert!(out.collected.prefix_bytes_saved > 0);
        let (mt_hits, _) = out.collected.hits[&Category::MultiTurn];
        assert!(mt_hits > 0, "a turn reads the turns before it");
    }

    #[test]
    fn a_request_limit_stops_the_run_early_and_nothing_is_counted_twice() {
        let cache = null_cache();
        let mut c = config(20, 30_000);
        c.max_requests = 25;
        let began = Instant::now();
        let out = run(&c, &cache, &no_calls(), &mut |_, _| {}).expect("run");
        assert!(
            began.elapsed() < Duration::from_secs(25),
            "stopped at the limit"
        );
        assert!(out.collected.requests.len() >= 25);
        assert!(out.elapsed_s < 30.0);
    }

    fn autoscaled(mode: AutoscaleMode, users: u32, ms: u64) -> BenchConfig {
        BenchConfig {
            autoscale: Some(AutoscaleConfig {
                mode,
                target_saturation: 0.5,
                interval_s: 0.4,
                max_users: 500,
            }),
            ..config(users, ms)
        }
    }

    #[test]
    fn the_capacity_autoscaler_starts_user_threads() {
        let cache = null_cache();
        let out = run(
            &autoscaled(AutoscaleMode::Capacity, 5, 2500),
            &cache,
            &no_calls(),
            &mut |_, _| {},
        )
        .expect("run");
        assert_eq!(out.scale_events[0].action, "scale_up");
        assert_eq!(out.scale_events[0].to_users, 10);
        let most = out.timeline.iter().map(|t| t.live_users).max().unwrap_or(0);
        assert!(most >= 10, "live user threads grew: {:?}", out.timeline);
    }

    #[test]
    fn the_qos_autoscaler_stops_user_threads_when_storage_saturates() {
        // Reads of 6-200 MB entries at 0.5 GB/s: a read P95 well over 100 ms, saturation 1
        // against a target of 0.5; single decode reads keep requests short, so a user
        // thread told to stop ends soon.
        let cache = TierCache::new(vec![TierSpec {
            kind: TierKind::Storage,
            capacity: None,
            store: TierStore::Modelled { gbps: 0.5 },
        }])
        .expect("tiers");
        let config = BenchConfig {
            personas: PersonaSet::January2026,
            decode_reads: DecodeReads::Single,
            ..autoscaled(AutoscaleMode::Qos, 10, 4000)
        };
        let out = run(&config, &cache, &no_calls(), &mut |_, _| {}).expect("run");
        let down = out
            .scale_events
            .iter()
            .find(|e| e.action == "scale_down")
            .expect("a scale-down");
        assert_eq!(down.to_users, down.from_users * 4 / 5);
        let live: Vec<u32> = out.timeline.iter().map(|t| t.live_users).collect();
        let peak = live
            .iter()
            .position(|&n| n == *live.iter().max().expect("windows"));
        assert!(
            live[peak.expect("peak")..]
                .iter()
                .any(|&n| n < live[peak.expect("peak")]),
            "user threads ended after the scale-down: {live:?}"
        );
    }

    #[test]
    fn rag_chunks_are_ingested_once_and_retrieved() {
        let cache = null_cache();
        let corpus = Corpus::new(3, 4, false);
        let chunks = corpus.chunks().count() as u64;
        let config = BenchConfig {
            rag: Some(corpus),
            ..config(40, 2500)
        };
        let out = run(&config, &cache, &no_calls(), &mut |_, _| {}).expect("run");
        let (hits, _) = out.collected.hits[&Category::Rag];
        assert!(hits > 0, "retrievals read ingested chunks");
        let written = cache.counters()[0].1.writes;
        assert!(
            written >= chunks,
            "{written} writes, {chunks} chunks ingested"
        );
    }
}
