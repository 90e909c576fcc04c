//! Live mock workers for online mode: each worker is a thread that owns its engines, runs a
//! pass when asked, sleeps for as long as the pass takes (the timing model's milliseconds,
//! already divided by the speedup ratios) and reports what the pass did. The simulation
//! thread routes, queues and collects on the wall clock, as a frontend would.

use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use super::engine::{Engine, PassOutput, Sequence};

enum Command {
    Enqueue(usize, Sequence),
    RunPass,
}

/// What a live worker reports after a pass.
pub struct Done {
    pub pool: usize,
    pub worker: usize,
    /// Per-rank outputs; empty when no rank could do anything.
    pub outputs: Vec<(usize, PassOutput)>,
    /// Every rank is idle after the pass.
    pub idle: bool,
}

/// The simulation thread's handle on one worker thread.
pub struct LiveWorker {
    commands: Option<Sender<Command>>,
    thread: Option<JoinHandle<()>>,
    /// Has requests it may be able to serve (set on enqueue, cleared by an idle or
    /// fruitless pass).
    pub has_work: bool,
}

impl LiveWorker {
    /// Starts a worker thread owning `ranks`; it reports on `done`.
    pub fn spawn(
        pool: usize,
        worker: usize,
        mut ranks: Vec<Engine>,
        done: Sender<Done>,
    ) -> std::io::Result<LiveWorker> {
        let (tx, rx): (Sender<Command>, Receiver<Command>) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name(format!("kvtrace-worker-{pool}-{worker}"))
            .spawn(move || {
                while let Ok(command) = rx.recv() {
                    match command {
                        Command::Enqueue(rank, seq) => ranks[rank].enqueue(seq),
                        Command::RunPass => {
                            let mut outputs = Vec::new();
                            let mut longest = 0.0f64;
                            for (rank, engine) in ranks.iter_mut().enumerate() {
                                if let Some(out) = engine.pass(None) {
                                    longest = longest.max(out.end_ms(0.0));
                                    outputs.push((rank, out));
                                }
                            }
                            std::thread::sleep(Duration::from_secs_f64(longest / 1e3));
                            let idle = ranks.iter().all(Engine::is_idle);
                            let report = Done {
                                pool,
                                worker,
                                outputs,
                                idle,
                            };
                            if done.send(report).is_err() {
                                break;
                            }
                        }
                    }
                }
            })?;
        Ok(LiveWorker {
            commands: Some(tx),
            thread: Some(thread),
            has_work: false,
        })
    }

    pub fn enqueue(&mut self, rank: usize, seq: Sequence) {
        if let Some(tx) = &self.commands {
            let _ = tx.send(Command::Enqueue(rank, seq));
        }
        self.has_work = true;
    }

    pub fn run_pass(&self) {
        if let Some(tx) = &self.commands {
            let _ = tx.send(Command::RunPass);
        }
    }
}

impl Drop for LiveWorker {
    fn drop(&mut self) {
        self.commands.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
