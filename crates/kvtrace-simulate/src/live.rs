//! Live mock workers for online mode: each worker is a thread that owns its engines, runs a
//! pass when asked, sleeps for as long as the pass takes (the timing model's milliseconds,
//! already divided by the speedup ratios) and reports what the pass did. Handoff commands
//! (reserve room, activate, release a held source) run between passes, in the order they
//! were sent, and report any room they found. The simulation thread routes, queues and
//! collects on the wall clock, as a frontend would.

use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use super::engine::{Engine, PassOutput, Request, RequestId, Reserved};

enum Command {
    Enqueue(usize, Request),
    RunPass,
    Reserve(usize, Request),
    Activate(usize, RequestId),
    Release(usize, RequestId),
}

/// What a live worker reports after a pass or a handoff command.
pub struct Done {
    pub pool: usize,
    pub worker: usize,
    /// A pass ran (else a command did).
    pub ran_pass: bool,
    /// Per-rank outputs; empty when no rank could do anything.
    pub outputs: Vec<(usize, PassOutput)>,
    /// Every rank is idle after the pass.
    pub idle: bool,
    /// Transferred prompts that found room.
    pub reserved: Vec<Reserved>,
}

/// The simulation thread's handle on one worker thread.
pub struct LiveWorker {
    commands: Option<Sender<Command>>,
    thread: Option<JoinHandle<()>>,
    /// Has requests it may be able to serve (set on enqueue and activation, cleared by an
    /// idle or fruitless pass).
    pub has_work: bool,
}

fn serve(
    pool: usize,
    worker: usize,
    mut ranks: Vec<Engine>,
    rx: Receiver<Command>,
    done: Sender<Done>,
) {
    // Passes since the worker last held no request, as the event loop's workers count them.
    let mut wave_step = 0u64;
    while let Ok(command) = rx.recv() {
        let mut report = Done {
            pool,
            worker,
            ran_pass: false,
            outputs: Vec::new(),
            idle: false,
            reserved: Vec::new(),
        };
        match command {
            Command::Enqueue(rank, r) => {
                ranks[rank].enqueue(r);
                continue;
            }
            Command::RunPass => {
                let mut longest = 0.0f64;
                for (rank, engine) in ranks.iter_mut().enumerate() {
                    engine.set_wave_step(wave_step);
                    if let Some(out) = engine.pass(None) {
                        longest = longest.max(out.end_ms(0.0));
                        report.outputs.push((rank, out));
                    }
                }
                std::thread::sleep(Duration::from_secs_f64(longest / 1e3));
                report.ran_pass = true;
                if !report.outputs.is_empty() {
                    wave_step += 1;
                }
                Engine::settle_wave(&ranks, &mut wave_step);
                report.idle = ranks.iter().all(Engine::is_idle);
                report
                    .reserved
                    .extend(ranks.iter_mut().filter_map(Engine::retry_destinations));
            }
            Command::Reserve(rank, r) => {
                if let Ok(Some(found)) = ranks[rank].reserve_destination(r, true) {
                    report.reserved.push(found);
                }
            }
            Command::Activate(rank, id) => report.reserved.extend(ranks[rank].activate(id)),
            Command::Release(rank, id) => {
                ranks[rank].release_source(id);
                Engine::settle_wave(&ranks, &mut wave_step);
                continue;
            }
        }
        if (report.ran_pass || !report.reserved.is_empty()) && done.send(report).is_err() {
            break;
        }
    }
}

impl LiveWorker {
    /// Starts a worker thread owning `ranks`; it reports on `done`.
    pub fn spawn(
        pool: usize,
        worker: usize,
        ranks: Vec<Engine>,
        done: Sender<Done>,
    ) -> std::io::Result<LiveWorker> {
        let (tx, rx): (Sender<Command>, Receiver<Command>) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name(format!("kvtrace-worker-{pool}-{worker}"))
            .spawn(move || serve(pool, worker, ranks, rx, done))?;
        Ok(LiveWorker {
            commands: Some(tx),
            thread: Some(thread),
            has_work: false,
        })
    }

    fn send(&self, command: Command) {
        if let Some(tx) = &self.commands {
            let _ = tx.send(command);
        }
    }

    pub fn enqueue(&mut self, rank: usize, r: Request) {
        self.send(Command::Enqueue(rank, r));
        self.has_work = true;
    }

    pub fn run_pass(&self) {
        self.send(Command::RunPass);
    }

    pub fn reserve_destination(&mut self, rank: usize, r: Request) {
        self.send(Command::Reserve(rank, r));
    }

    pub fn activate(&mut self, rank: usize, id: RequestId) {
        self.send(Command::Activate(rank, id));
        self.has_work = true;
    }

    pub fn release_source(&mut self, rank: usize, id: RequestId) {
        self.send(Command::Release(rank, id));
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
