//! Asynchronous tier I/O: an L2 tier's backend calls run on worker threads behind bounded
//! queues, as a server's store tasks and prefetch loads run beside its request path, while
//! the tier's accounting (what is resident, what a lookup finds) stays on the manager's
//! thread and so stays deterministic.
//!
//! Every call is timed three ways: queue wait (issued → a worker takes it, including any
//! wait for room in a full queue), service (the backend call itself) and end to end. In a
//! paced replay each call also has a due time — the trace's clock of the manager call that
//! issued it, mapped to wall time — and its schedule lag is how late a worker began it.
//!
//! Keys are sharded over the workers by hash, so one key's write, reads and delete run on
//! one worker in the order they were issued, and a backend that keeps per-connection state
//! (a `memory` tier's map, a file tier's sizes) sees each key on one connection only.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::backend::Backend;
use super::cost_fit::{Cost, CostFit};
use super::l2::transfer_time;
use super::worker_pool::WorkerPool;
use super::KeyId;

/// The longest time a histogram keeps: one hour, in nanoseconds; longer ones are clamped.
const MAX_NS: u64 = 3_600 * 1_000_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("constant bounds are valid")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(MAX_NS);
    h.saturating_record(ns.min(MAX_NS));
}

/// The 50th, 90th and 99th percentiles and the largest of one timing, in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1e6;
        Percentiles {
            p50_ms: ms(0.50),
            p90_ms: ms(0.90),
            p99_ms: ms(0.99),
            max_ms: h.max() as f64 / 1e6,
        }
    }
}

/// What kind of backend call an operation is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Write,
    Read,
    Delete,
}

/// The timing and outcome of one backend call.
pub struct IoDone {
    pub kind: IoKind,
    pub bytes: u64,
    pub issued: Instant,
    pub started: Instant,
    pub finished: Instant,
    /// The time the call counts for: the device model's where the backend has one.
    pub service: Duration,
    pub due: Option<Instant>,
    /// `Err` carries the backend's error; `Ok(false)` a read that found nothing.
    pub outcome: io::Result<bool>,
}

/// Everything measured of one tier's backend calls.
pub struct IoRecord {
    wait: Histogram<u64>,
    service: Histogram<u64>,
    end_to_end: Histogram<u64>,
    lag: Histogram<u64>,
    pub writes: u64,
    pub reads: u64,
    pub deletes: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub write_time: Duration,
    pub read_time: Duration,
    pub write_errors: u64,
    pub read_errors: u64,
    pub delete_errors: u64,
    /// Reads the accounting counted as hits whose object the backend no longer had.
    pub lost_reads: u64,
    pub first_error: Option<String>,
    first_issued: Option<Instant>,
    last_finished: Option<Instant>,
    /// Time the manager's thread waited for room in a full queue.
    pub stall: Duration,
    pub drain: Duration,
    /// Keys whose write failed: the accounting drops them (a refused store holds nothing).
    failed_writes: Vec<KeyId>,
    /// Service time against bytes of the successful reads and writes.
    read_fit: CostFit,
    write_fit: CostFit,
}

impl Default for IoRecord {
    fn default() -> Self {
        IoRecord {
            wait: histogram(),
            service: histogram(),
            end_to_end: histogram(),
            lag: histogram(),
            writes: 0,
            reads: 0,
            deletes: 0,
            bytes_written: 0,
            bytes_read: 0,
            write_time: Duration::ZERO,
            read_time: Duration::ZERO,
            write_errors: 0,
            read_errors: 0,
            delete_errors: 0,
            lost_reads: 0,
            first_error: None,
            first_issued: None,
            last_finished: None,
            stall: Duration::ZERO,
            drain: Duration::ZERO,
            failed_writes: Vec::new(),
            read_fit: CostFit::default(),
            write_fit: CostFit::default(),
        }
    }
}

impl IoRecord {
    /// Counts one call; `keys` are the objects a failed write leaves unstored.
    pub fn add(&mut self, done: IoDone, keys: &[KeyId]) {
        let wait = done.started.saturating_duration_since(done.issued);
        record(&mut self.wait, wait);
        record(&mut self.service, done.service);
        // Wait plus service, so that a modelled service (a GPU budget) stays modelled here.
        record(&mut self.end_to_end, wait.saturating_add(done.service));
        if let Some(due) = done.due {
            record(&mut self.lag, done.started.saturating_duration_since(due));
        }
        self.first_issued = Some(
            self.first_issued
                .map_or(done.issued, |t| t.min(done.issued)),
        );
        self.last_finished = Some(
            self.last_finished
                .map_or(done.finished, |t| t.max(done.finished)),
        );
        let failed = match &done.outcome {
            Err(e) => {
                self.first_error.get_or_insert_with(|| e.to_string());
                true
            }
            Ok(_) => false,
        };
        match done.kind {
            IoKind::Write => {
                self.writes += 1;
                self.write_time += done.service;
                if failed {
                    self.write_errors += 1;
                    self.failed_writes.extend_from_slice(keys);
                } else {
                    self.bytes_written += done.bytes;
                    self.write_fit.add(done.bytes, done.service);
                }
            }
            IoKind::Read => {
                self.reads += 1;
                self.read_time += done.service;
                match done.outcome {
                    Err(_) => self.read_errors += 1,
                    Ok(false) => self.lost_reads += 1,
                    Ok(true) => {
                        self.bytes_read += done.bytes;
                        self.read_fit.add(done.bytes, done.service);
                    }
                }
            }
            IoKind::Delete => {
                self.deletes += 1;
                self.delete_errors += u64::from(failed);
            }
        }
    }

    /// The keys of the writes that failed since the last call.
    pub fn take_failed_writes(&mut self) -> Vec<KeyId> {
        std::mem::take(&mut self.failed_writes)
    }

    /// The figures of a report.
    pub fn summary(&self, paced: bool) -> QueueFigures {
        let span = match (self.first_issued, self.last_finished) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let bytes = self.bytes_written + self.bytes_read;
        QueueFigures {
            writes: self.writes,
            reads: self.reads,
            deletes: self.deletes,
            bytes_written: self.bytes_written,
            bytes_read: self.bytes_read,
            queue_wait_ms: Percentiles::of(&self.wait),
            service_ms: Percentiles::of(&self.service),
            end_to_end_ms: Percentiles::of(&self.end_to_end),
            schedule_lag_ms: paced.then(|| Percentiles::of(&self.lag)),
            submit_stall_s: self.stall.as_secs_f64(),
            drain_s: self.drain.as_secs_f64(),
            span_s: span,
            mib_per_s: if span > 0.0 {
                bytes as f64 / (1u64 << 20) as f64 / span
            } else {
                0.0
            },
            lost_reads: self.lost_reads,
            first_error: self.first_error.clone(),
            read_cost: self.read_fit.cost(),
            write_cost: self.write_fit.cost(),
        }
    }
}

/// One tier's backend calls in a report: counts, bytes and the three timings.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct QueueFigures {
    pub writes: u64,
    pub reads: u64,
    pub deletes: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Issued → taken by a worker (0 for synchronous I/O).
    pub queue_wait_ms: Percentiles,
    /// The backend call itself.
    pub service_ms: Percentiles,
    /// Issued → done: what a request waiting on the call would wait.
    pub end_to_end_ms: Percentiles,
    /// Due (the trace's clock) → taken by a worker; paced asynchronous replays only.
    pub schedule_lag_ms: Option<Percentiles>,
    /// Time the replay waited for room in a full queue.
    pub submit_stall_s: f64,
    /// Time the queues took to empty after the last call was issued.
    pub drain_s: f64,
    /// First call issued → last one done, and the bytes moved per second over it.
    pub span_s: f64,
    pub mib_per_s: f64,
    /// Reads the cache counted as hits whose object the backend no longer had (asynchronous
    /// I/O decides before it reads).
    pub lost_reads: u64,
    pub first_error: Option<String>,
    /// Service time fitted to bytes (latency plus bytes over bandwidth) over the successful
    /// reads and writes: what `simulate --offload-calibration` reads.
    pub read_cost: Option<Cost>,
    pub write_cost: Option<Cost>,
}

/// An operation for a worker.
enum Op {
    Write(KeyId, u64),
    /// A shared tier's batch: one round trip.
    WriteMany(Vec<(KeyId, u64)>),
    Read(KeyId, u64),
    Delete(KeyId),
}

struct Job {
    op: Op,
    issued: Instant,
    due: Option<Instant>,
}

/// How the trace's clock maps to wall time in a paced replay.
#[derive(Clone, Copy)]
struct Pace {
    epoch: Instant,
    base: f64,
    speedup: f64,
}

/// One tier's workers and queues.
pub(super) struct IoQueues {
    pool: WorkerPool<Job>,
    record: Arc<Mutex<IoRecord>>,
    failed: Arc<AtomicBool>,
    pace: Option<Pace>,
    /// The trace time of the manager call now running.
    now: f64,
}

/// The record, even if a worker panicked while holding it (its counters stay usable).
fn lock(record: &Mutex<IoRecord>) -> MutexGuard<'_, IoRecord> {
    record.lock().unwrap_or_else(|e| e.into_inner())
}

impl IoQueues {
    /// Starts one worker per backend; `depth` calls may wait in all queues together.
    pub(super) fn start(
        tier: &str,
        backends: Vec<Box<dyn Backend>>,
        depth: u32,
    ) -> io::Result<IoQueues> {
        let record = Arc::new(Mutex::new(IoRecord::default()));
        let failed = Arc::new(AtomicBool::new(false));
        let workers = backends.len();
        let mut backends = backends.into_iter();
        let pool = WorkerPool::start(
            &format!("kvtrace {tier} io"),
            workers,
            depth as usize,
            |_| {
                let (record, failed) = (record.clone(), failed.clone());
                let mut backend = backends.next().expect("one backend per worker");
                move |job| run(&mut *backend, job, &record, &failed)
            },
        )?;
        Ok(IoQueues {
            pool,
            record,
            failed,
            pace: None,
            now: 0.0,
        })
    }

    /// Maps the trace's clock to wall time: trace time `base` is `epoch`, and the trace
    /// runs `speedup` times faster than it was recorded.
    pub(super) fn pace(&mut self, epoch: Instant, base: f64, speedup: f64) {
        self.pace = Some(Pace {
            epoch,
            base,
            speedup: speedup.max(1e-9),
        });
    }

    pub(super) fn set_now(&mut self, now: f64) {
        self.now = now;
    }

    pub(super) fn paced(&self) -> bool {
        self.pace.is_some()
    }

    fn shard(&self, key: KeyId) -> usize {
        self.pool.shard(key)
    }

    pub(super) fn write(&mut self, key: KeyId, size: u64) {
        self.submit(self.shard(key), Op::Write(key, size));
    }

    pub(super) fn read(&mut self, key: KeyId, size: u64) {
        self.submit(self.shard(key), Op::Read(key, size));
    }

    pub(super) fn delete(&mut self, key: KeyId) {
        self.submit(self.shard(key), Op::Delete(key));
    }

    /// A batch, one per worker its keys belong to.
    pub(super) fn write_many(&mut self, objects: &[(KeyId, u64)]) {
        let mut per_worker: Vec<Vec<(KeyId, u64)>> = vec![Vec::new(); self.pool.workers()];
        for &(key, size) in objects {
            per_worker[self.shard(key)].push((key, size));
        }
        for (worker, batch) in per_worker.into_iter().enumerate() {
            if !batch.is_empty() {
                self.submit(worker, Op::WriteMany(batch));
            }
        }
    }

    fn submit(&mut self, worker: usize, op: Op) {
        let due = self.pace.map(|p| {
            let s = ((self.now - p.base).max(0.0) / p.speedup).min(1e9);
            p.epoch + Duration::from_secs_f64(s)
        });
        let issued = Instant::now();
        let refused = match self.pool.send(worker, Job { op, issued, due }) {
            Ok(waited) => {
                if !waited.is_zero() {
                    lock(&self.record).stall += waited;
                }
                return;
            }
            Err(job) => job,
        };
        // The worker is gone (it panicked): the call is counted as failed, not lost.
        let (kind, keys) = match refused.op {
            Op::Write(key, _) => (IoKind::Write, vec![key]),
            Op::WriteMany(batch) => (IoKind::Write, batch.iter().map(|o| o.0).collect()),
            Op::Read(..) => (IoKind::Read, Vec::new()),
            Op::Delete(_) => (IoKind::Delete, Vec::new()),
        };
        let now = Instant::now();
        let done = IoDone {
            kind,
            bytes: 0,
            issued,
            started: now,
            finished: now,
            service: Duration::ZERO,
            due: None,
            outcome: Err(io::Error::other("the tier's I/O worker stopped")),
        };
        lock(&self.record).add(done, &keys);
        self.failed.store(true, Ordering::Release);
    }

    /// Keys whose write failed since the last call: the accounting must drop them.
    pub(super) fn take_failed_writes(&self) -> Vec<KeyId> {
        if !self.failed.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        lock(&self.record).take_failed_writes()
    }

    /// Waits until every queued call is done; the time it took is the drain time.
    pub(super) fn drain(&mut self) {
        let took = self.pool.drain();
        lock(&self.record).drain += took;
    }

    pub(super) fn with_record<T>(&self, f: impl FnOnce(&IoRecord) -> T) -> T {
        f(&lock(&self.record))
    }
}

/// One call on a worker's backend, timed and recorded.
fn run(backend: &mut dyn Backend, job: Job, record: &Mutex<IoRecord>, failed: &AtomicBool) {
    let started = Instant::now();
    let mut batch = Vec::new();
    let (kind, bytes, outcome) = match job.op {
        Op::Write(key, size) => {
            batch.push((key, size));
            (IoKind::Write, size, backend.put(key, size).map(|()| true))
        }
        Op::WriteMany(objects) => {
            batch = objects;
            let bytes = batch.iter().map(|o| o.1).sum();
            (
                IoKind::Write,
                bytes,
                backend.put_many(&batch).map(|()| true),
            )
        }
        Op::Read(key, size) => (IoKind::Read, size, backend.get(key)),
        Op::Delete(key) => (IoKind::Delete, 0, backend.delete(key).map(|()| true)),
    };
    let finished = Instant::now();
    let service = transfer_time(backend, bytes, finished - started);
    let write_failed = kind == IoKind::Write && outcome.is_err();
    let keys: Vec<KeyId> = if write_failed {
        batch.iter().map(|o| o.0).collect()
    } else {
        Vec::new()
    };
    let done = IoDone {
        kind,
        bytes,
        issued: job.issued,
        started,
        finished,
        service,
        due: job.due,
        outcome,
    };
    lock(record).add(done, &keys);
    if write_failed {
        failed.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::storage::KeyMap;

    /// A backend that holds what it is given, takes `pause` per call, counts how many of
    /// its kind run at once, and refuses writes of the keys in `refuse`.
    struct Probe {
        held: KeyMap<u64>,
        pause: Duration,
        running: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        refuse: Vec<KeyId>,
    }

    impl Probe {
        fn call<T>(&self, f: impl FnOnce() -> T) -> T {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(self.pause);
            let out = f();
            self.running.fetch_sub(1, Ordering::SeqCst);
            out
        }
    }

    impl Backend for Probe {
        fn name(&self) -> &'static str {
            "probe"
        }
        fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
            if self.refuse.contains(&key) {
                return Err(io::Error::other("refused"));
            }
            self.call(|| ());
            self.held.insert(key, size);
            Ok(())
        }
        fn get(&mut self, key: KeyId) -> io::Result<bool> {
            Ok(self.call(|| self.held.contains_key(&key)))
        }
        fn delete(&mut self, key: KeyId) -> io::Result<()> {
            self.held.remove(&key);
            Ok(())
        }
        fn contains(&self, key: KeyId) -> bool {
            self.held.contains_key(&key)
        }
    }

    fn queues(
        workers: usize,
        depth: u32,
        pause: Duration,
        refuse: &[KeyId],
    ) -> (IoQueues, Arc<AtomicUsize>) {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let backends = (0..workers)
            .map(|_| {
                Box::new(Probe {
                    held: KeyMap::default(),
                    pause,
                    running: running.clone(),
                    most: most.clone(),
                    refuse: refuse.to_vec(),
                }) as Box<dyn Backend>
            })
            .collect();
        (
            IoQueues::start("L2[0]", backends, depth).expect("threads"),
            most,
        )
    }

    #[test]
    fn each_keys_calls_run_in_the_order_issued_whichever_worker_serves_it() {
        let (mut q, _) = queues(4, 8, Duration::ZERO, &[]);
        for k in 0..200u128 {
            q.write(KeyId(k), 10);
            q.read(KeyId(k), 10);
            q.delete(KeyId(k));
            q.read(KeyId(k), 10);
        }
        q.drain();
        q.with_record(|r| {
            assert_eq!((r.writes, r.reads, r.deletes), (200, 400, 200));
            // The read after each write found the object, the one after each delete did not.
            assert_eq!(r.bytes_read, 2000);
            assert_eq!(r.lost_reads, 200);
            assert_eq!(r.write_errors + r.read_errors + r.delete_errors, 0);
        });
    }

    #[test]
    fn workers_serve_at_once_and_a_full_queue_holds_the_caller() {
        let pause = Duration::from_millis(20);
        let (mut q, most) = queues(3, 3, pause, &[]);
        for k in 0..12u128 {
            q.write(KeyId(k), 1);
        }
        q.drain();
        let figures = q.with_record(|r| r.summary(false));
        let most = most.load(Ordering::SeqCst);
        assert!((2..=3).contains(&most), "{most} calls at once");
        assert!(figures.submit_stall_s > 0.0, "{figures:?}");
        // The last writes waited behind at least one 20 ms call on their worker.
        assert!(figures.queue_wait_ms.max_ms >= 20.0, "{figures:?}");
        assert!(figures.service_ms.p50_ms >= 20.0, "{figures:?}");
        assert!(figures.schedule_lag_ms.is_none());
    }

    #[test]
    fn a_refused_write_is_counted_and_handed_back_for_the_accounting() {
        let (mut q, _) = queues(2, 4, Duration::ZERO, &[KeyId(7)]);
        q.write_many(&[(KeyId(6), 1), (KeyId(8), 1)]);
        q.write(KeyId(7), 1);
        q.drain();
        assert_eq!(q.take_failed_writes(), vec![KeyId(7)]);
        assert!(q.take_failed_writes().is_empty(), "handed back once");
        let figures = q.with_record(|r| r.summary(false));
        assert_eq!(figures.first_error.as_deref(), Some("refused"));
        q.with_record(|r| assert_eq!((r.write_errors, r.bytes_written), (1, 2)));
    }

    #[test]
    fn a_paced_call_reports_how_late_it_began() {
        let (mut q, _) = queues(1, 1, Duration::from_millis(30), &[]);
        // Trace time 0 was due 50 ms ago, at the replay's own speed.
        q.pace(Instant::now() - Duration::from_millis(50), 0.0, 1.0);
        q.set_now(0.0);
        q.write(KeyId(1), 1);
        q.drain();
        let lag = q
            .with_record(|r| r.summary(true))
            .schedule_lag_ms
            .expect("paced");
        assert!(lag.p50_ms >= 50.0, "{lag:?}");
    }
}
