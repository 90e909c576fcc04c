//! Worker threads behind bounded queues, one queue each: the machinery of asynchronous tier
//! I/O, shared by the replay's L2 tiers and the benchmark's storage tier. A caller picks a
//! job's worker (by key, with [`WorkerPool::shard`], so one key's jobs run in the order they
//! were queued), waits when that queue is full, and can wait for everything queued so far.

use std::io;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::KeyId;

enum Msg<J> {
    Job(J),
    /// Answered once every job queued before it is done.
    Drain(Sender<()>),
}

/// `workers` threads, each running its handler on its own queue's jobs in order.
pub struct WorkerPool<J> {
    senders: Vec<Sender<Msg<J>>>,
    workers: Vec<JoinHandle<()>>,
}

impl<J: Send + 'static> WorkerPool<J> {
    /// Starts `workers` threads named `<name> <i>`; worker `i` hands each of its jobs to the
    /// handler `make(i)` returns. `depth` jobs may wait in all the queues together.
    pub fn start<H>(
        name: &str,
        workers: usize,
        depth: usize,
        mut make: impl FnMut(usize) -> H,
    ) -> io::Result<WorkerPool<J>>
    where
        H: FnMut(J) + Send + 'static,
    {
        let workers = workers.max(1);
        let each = depth.div_ceil(workers).max(1);
        let mut pool = WorkerPool {
            senders: Vec::new(),
            workers: Vec::new(),
        };
        for i in 0..workers {
            let (tx, rx) = crossbeam_channel::bounded(each);
            let handle = make(i);
            pool.workers.push(
                std::thread::Builder::new()
                    .name(format!("{name} {i}"))
                    .spawn(move || work(&rx, handle))?,
            );
            pool.senders.push(tx);
        }
        Ok(pool)
    }

    pub fn workers(&self) -> usize {
        self.senders.len()
    }

    /// The worker of `key`: always the same one.
    pub fn shard(&self, key: KeyId) -> usize {
        let id = key.0;
        let folded = (id as u64) ^ ((id >> 64) as u64);
        (folded.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % self.senders.len()
    }

    /// Queues `job` on `worker`, waiting while its queue is full: how long it waited, or the
    /// job back when the worker is gone (it panicked).
    pub fn send(&self, worker: usize, job: J) -> Result<Duration, J> {
        let sender = &self.senders[worker];
        let began = Instant::now();
        let back = |msg: Msg<J>| match msg {
            Msg::Job(job) => job,
            Msg::Drain(_) => unreachable!("only jobs are sent here"),
        };
        match sender.try_send(Msg::Job(job)) {
            Ok(()) => Ok(Duration::ZERO),
            Err(TrySendError::Full(msg)) => match sender.send(msg) {
                Ok(()) => Ok(began.elapsed()),
                Err(e) => Err(back(e.into_inner())),
            },
            Err(TrySendError::Disconnected(msg)) => Err(back(msg)),
        }
    }

    /// Returns once every job queued so far is done; how long that took.
    pub fn drain(&self) -> Duration {
        let began = Instant::now();
        let replies: Vec<Receiver<()>> = self
            .senders
            .iter()
            .filter_map(|s| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                s.send(Msg::Drain(tx)).ok().map(|()| rx)
            })
            .collect();
        for reply in replies {
            let _ = reply.recv();
        }
        began.elapsed()
    }
}

impl<J> Drop for WorkerPool<J> {
    /// Lets the workers finish what is queued and stop.
    fn drop(&mut self) {
        self.senders.clear();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn work<J>(jobs: &Receiver<Msg<J>>, mut handle: impl FnMut(J)) {
    for msg in jobs {
        match msg {
            Msg::Job(job) => handle(job),
            Msg::Drain(reply) => {
                let _ = reply.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn one_keys_jobs_run_in_order_and_drain_waits_for_all() {
        let seen: Arc<Mutex<Vec<(usize, u32)>>> = Arc::default();
        let pool = WorkerPool::start("test pool", 3, 6, |i| {
            let seen = Arc::clone(&seen);
            move |n: u32| {
                std::thread::sleep(Duration::from_micros(u64::from(n % 7) * 50));
                seen.lock().unwrap().push((i, n));
            }
        })
        .expect("start");
        assert_eq!(pool.workers(), 3);
        let key = KeyId(42);
        let worker = pool.shard(key);
        assert_eq!(worker, pool.shard(key), "a key has one worker");
        for n in 0..50 {
            pool.send(worker, n).expect("queued");
        }
        pool.drain();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 50, "drain returned after every job");
        assert!(seen.iter().all(|&(i, _)| i == worker));
        assert!(seen.windows(2).all(|w| w[0].1 < w[1].1), "in queue order");
    }
}
