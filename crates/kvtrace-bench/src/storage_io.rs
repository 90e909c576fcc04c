//! How the storage tier's reads, writes and deletes reach it, and every one of them timed.
//!
//! Synchronously, as `kv-cache.py` does them: each call runs on the thread of the request
//! or demotion that makes it. Asynchronously, as a serving stack's offload store tasks run:
//! the calls go to worker threads behind bounded queues; a write or a delete returns once
//! queued (a request waits only for queue room), a read waits for its turn and its answer.
//! Keys are sharded over the workers by hash, so one key's write, reads and delete run in
//! the order they were issued — a read never overtakes the write it reads back. The cache's
//! decisions (placement, victims, what a lookup finds) stay with the tier hierarchy, under
//! its lock, in both modes. A queued write the storage refuses is handed back, and the
//! hierarchy forgets the entry before its next decision, as a refused synchronous write
//! leaves nothing.
//!
//! In both modes each call's queue wait, service and end-to-end time go into one
//! [`IoRecord`] (wait is 0 when synchronous), so the report compares the modes figure by
//! figure.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, Sender};
use serde::Serialize;

use super::io::{IoBuffer, IoTime};
use super::tiers::{store_delete, store_read, store_write, TierSpec};
use kvtrace_cache::storage::config::L2Io;
use kvtrace_cache::storage::worker_pool::WorkerPool;
use kvtrace_cache::storage::{IoDone, IoKind, IoRecord, KeyId, QueueFigures};

/// The storage tier's calls in a report.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StorageIoReport {
    pub mode: &'static str,
    pub queue_depth: Option<u32>,
    pub workers: Option<u32>,
    pub write_errors: u64,
    pub read_errors: u64,
    #[serde(flatten)]
    pub calls: QueueFigures,
}

enum Op {
    Write {
        key: KeyId,
        size: u64,
        stamp: u64,
    },
    Read {
        key: KeyId,
        size: u64,
        reply: Sender<io::Result<IoTime>>,
        /// Set when the request stopped waiting (the run's deadline): the read is skipped.
        abandoned: Arc<AtomicBool>,
    },
    Delete {
        key: KeyId,
        size: u64,
    },
}

struct Job {
    op: Op,
    issued: Instant,
}

/// The storage tier's I/O path: its record, and when asynchronous its workers.
pub(crate) struct StoragePath {
    spec: TierSpec,
    record: Arc<Mutex<IoRecord>>,
    /// Set by a worker whose write failed: the hierarchy has entries to forget.
    failed: Arc<AtomicBool>,
    /// How the calls are made: the replay's L2 I/O modes, the storage tier being the
    /// hierarchy's L2.
    mode: L2Io,
    /// The workers, when asynchronous.
    pool: Option<WorkerPool<Job>>,
}

fn lock(record: &Mutex<IoRecord>) -> MutexGuard<'_, IoRecord> {
    record.lock().unwrap_or_else(|e| e.into_inner())
}

/// A copy of an error for the record (an `io::Error` is not `Clone`).
fn copied(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// One call's record entry, begun at `issued` and run from `started` to now.
fn done(
    kind: IoKind,
    bytes: u64,
    issued: Instant,
    started: Instant,
    outcome: io::Result<bool>,
) -> IoDone {
    let finished = Instant::now();
    IoDone {
        kind,
        bytes,
        issued,
        started,
        finished,
        service: finished - started,
        due: None,
        outcome,
    }
}

/// A read's outcome for the record: a missing entry is a read that found nothing.
fn read_outcome(r: &io::Result<IoTime>) -> io::Result<bool> {
    match r {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(copied(e)),
    }
}

impl StoragePath {
    /// The path to the tier `spec` describes; workers start when `mode` is asynchronous.
    pub(crate) fn start(spec: TierSpec, mode: L2Io) -> io::Result<StoragePath> {
        let record = Arc::new(Mutex::new(IoRecord::default()));
        let failed = Arc::new(AtomicBool::new(false));
        let pool = match mode {
            L2Io::Synchronous => None,
            L2Io::Asynchronous { depth, workers } => {
                let pool = WorkerPool::start(
                    "kvtrace storage io",
                    workers as usize,
                    depth as usize,
                    |_| {
                        let (spec, record, failed) = (spec.clone(), record.clone(), failed.clone());
                        let mut buf = IoBuffer::new();
                        move |job| run(&spec, job, &mut buf, &record, &failed)
                    },
                )?;
                Some(pool)
            }
        };
        Ok(StoragePath {
            spec,
            record,
            failed,
            mode,
            pool,
        })
    }

    pub(crate) fn is_async(&self) -> bool {
        self.pool.is_some()
    }

    /// Queues `op` on its key's worker, waiting for room; how long the caller waited.
    fn submit(&self, pool: &WorkerPool<Job>, key: KeyId, op: Op) -> Duration {
        let issued = Instant::now();
        let refused = match pool.send(pool.shard(key), Job { op, issued }) {
            Ok(waited) => {
                if !waited.is_zero() {
                    lock(&self.record).stall += waited;
                }
                return waited;
            }
            Err(job) => job,
        };
        // The worker is gone (it panicked): the call failed, and is counted, not lost.
        let stopped = || io::Error::other("the storage tier's I/O worker stopped");
        let kind = match refused.op {
            Op::Write { .. } => IoKind::Write,
            Op::Read { reply, .. } => {
                let _ = reply.send(Err(stopped()));
                IoKind::Read
            }
            Op::Delete { .. } => IoKind::Delete,
        };
        let keys = if kind == IoKind::Write {
            vec![key]
        } else {
            Vec::new()
        };
        lock(&self.record).add(done(kind, 0, issued, issued, Err(stopped())), &keys);
        self.failed.store(true, Ordering::Release);
        issued.elapsed()
    }

    /// Writes an entry, or queues its write: the time the caller spent (for a queued
    /// write, the wait for queue room, as host time).
    pub(crate) fn write(
        &self,
        key: KeyId,
        size: u64,
        stamp: u64,
        buf: &mut IoBuffer,
    ) -> io::Result<IoTime> {
        if let Some(pool) = &self.pool {
            let waited = self.submit(pool, key, Op::Write { key, size, stamp });
            return Ok(IoTime {
                host_s: waited.as_secs_f64(),
                device_s: 0.0,
            });
        }
        let began = Instant::now();
        let r = store_write(&self.spec, key, size, stamp, buf);
        let outcome = r.as_ref().map(|_| true).map_err(copied);
        self.record_sync(done(IoKind::Write, size, began, began, outcome));
        r
    }

    /// Reads an entry; asynchronously, after every call queued before it on its worker,
    /// the wait counted as host time, and given up (`Interrupted`) once `buf`'s run stops.
    pub(crate) fn read(&self, key: KeyId, size: u64, buf: &mut IoBuffer) -> io::Result<IoTime> {
        if let Some(pool) = &self.pool {
            let (reply, answer) = crossbeam_channel::bounded(1);
            let abandoned = Arc::new(AtomicBool::new(false));
            let op = Op::Read {
                key,
                size,
                reply,
                abandoned: Arc::clone(&abandoned),
            };
            self.submit(pool, key, op);
            // The run's deadline stops the wait, and the worker skips a read not yet begun.
            loop {
                match answer.recv_timeout(Duration::from_millis(20)) {
                    Ok(read) => return read,
                    Err(RecvTimeoutError::Timeout) => {
                        if let Err(stopped) = buf.check() {
                            abandoned.store(true, Ordering::Release);
                            return Err(stopped);
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(io::Error::other("the storage tier's I/O worker stopped"))
                    }
                }
            }
        }
        let began = Instant::now();
        let r = store_read(&self.spec, key, size, buf);
        self.record_sync(done(IoKind::Read, size, began, began, read_outcome(&r)));
        r
    }

    /// Removes an entry, or queues its removal.
    pub(crate) fn delete(&self, key: KeyId, size: u64) -> io::Result<()> {
        if let Some(pool) = &self.pool {
            self.submit(pool, key, Op::Delete { key, size });
            return Ok(());
        }
        let began = Instant::now();
        let r = store_delete(&self.spec, key, size);
        let outcome = r.as_ref().map(|()| true).map_err(copied);
        self.record_sync(done(IoKind::Delete, 0, began, began, outcome));
        r
    }

    /// Records a call made on the caller's thread, unless the run's deadline cut it short:
    /// that is no figure of the storage's.
    fn record_sync(&self, entry: IoDone) {
        if !matches!(&entry.outcome, Err(e) if e.kind() == io::ErrorKind::Interrupted) {
            lock(&self.record).add(entry, &[]);
        }
    }

    /// The keys whose queued write failed since the last call.
    pub(crate) fn take_failed_writes(&self) -> Vec<KeyId> {
        if !self.failed.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        lock(&self.record).take_failed_writes()
    }

    /// Waits until every queued call is done; the time it took is the drain time.
    pub(crate) fn drain(&self) {
        if let Some(pool) = &self.pool {
            let took = pool.drain();
            lock(&self.record).drain += took;
        }
    }

    pub(crate) fn report(&self) -> StorageIoReport {
        let r = lock(&self.record);
        StorageIoReport {
            mode: self.mode.name(),
            queue_depth: match self.mode {
                L2Io::Asynchronous { depth, .. } => Some(depth),
                L2Io::Synchronous => None,
            },
            workers: self.pool.as_ref().map(|p| p.workers() as u32),
            write_errors: r.write_errors,
            read_errors: r.read_errors,
            calls: r.summary(false),
        }
    }
}

/// One call on the storage tier, made by a worker, timed and recorded; a read's answer goes
/// back to the request waiting for it.
fn run(
    spec: &TierSpec,
    job: Job,
    buf: &mut IoBuffer,
    record: &Mutex<IoRecord>,
    failed: &AtomicBool,
) {
    let started = Instant::now();
    let (entry, keys) = match job.op {
        Op::Write { key, size, stamp } => {
            let outcome = store_write(spec, key, size, stamp, buf).map(|_| true);
            let keys = if outcome.is_err() {
                vec![key]
            } else {
                Vec::new()
            };
            (
                done(IoKind::Write, size, job.issued, started, outcome),
                keys,
            )
        }
        Op::Read { abandoned, .. } if abandoned.load(Ordering::Acquire) => return,
        Op::Read {
            key, size, reply, ..
        } => {
            let r = store_read(spec, key, size, buf);
            let entry = done(IoKind::Read, size, job.issued, started, read_outcome(&r));
            let waited = started.saturating_duration_since(job.issued).as_secs_f64();
            let _ = reply.send(r.map(|t| IoTime {
                host_s: t.host_s + waited,
                device_s: t.device_s,
            }));
            (entry, Vec::new())
        }
        Op::Delete { key, size } => {
            let outcome = store_delete(spec, key, size).map(|()| true);
            (
                done(IoKind::Delete, 0, job.issued, started, outcome),
                Vec::new(),
            )
        }
    };
    let write_failed = !keys.is_empty();
    lock(record).add(entry, &keys);
    if write_failed {
        failed.store(true, Ordering::Release);
    }
}
