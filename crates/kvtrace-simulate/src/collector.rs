//! What the simulation measures, request by request, and the summary built from it: the
//! 74-key report with the names and definitions serving teams already compare (exact
//! rounded-rank percentiles and population deviation per request; pooled per-token gaps in a
//! sketch), plus kvtrace's per-request averages and SLA goodput, and the keys AISimulate's
//! engine adds (the prefill work executed, the sample counts, a request graph's plays).

use std::collections::BTreeMap;

use super::sketch::Sketch;
use super::summary::{AisimulateFigures, Figures, Goodput, PerRequest, Summary, Trajectories};
use crossbeam_channel::{bounded, Receiver, Sender};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Completed,
    Rejected,
    /// A disaggregated request whose decode worker refused its prompt (more than its KV
    /// cache holds, or `max_model_len` tokens or more), as AISimulate's handoff fails it.
    Failed,
}

impl Status {
    /// Whether the request ended without being served (rejected, or failed at its handoff),
    /// which ends its play under AISimulate's driver.
    pub fn is_failure(self) -> bool {
        matches!(self, Status::Rejected | Status::Failed)
    }

    /// Its name in the reports, the lines and the metrics' labels.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Completed => "completed",
            Status::Rejected => "rejected",
            Status::Failed => "failed",
        }
    }
}

/// One request's life.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    pub session_id: String,
    pub turn_index: u32,
    /// A request of a request graph (agentic, weka), whose sessions are not turns: its play
    /// (see [`crate::workload::Graph::plays`]). Its line lists no turn index, as
    /// AISimulate's does.
    #[serde(skip)]
    pub play: Option<u32>,
    pub uuid: u32,
    pub arrival_time_ms: f64,
    pub first_admit_ms: Option<f64>,
    pub terminal_time_ms: Option<f64>,
    pub first_token_ms: Option<f64>,
    #[serde(skip)]
    pub second_token_ms: Option<f64>,
    pub last_token_ms: Option<f64>,
    /// Token times until the request ends, when its gaps join the pooled distributions.
    #[serde(skip)]
    token_times: Vec<f64>,
    pub input_length: u32,
    pub requested_output_length: u32,
    pub output_length: u32,
    /// The largest prefix hit over the request's admissions, and its first admission's.
    pub reused_input_tokens: u32,
    #[serde(skip)]
    pub first_reused_input_tokens: Option<u32>,
    /// The ranks that ran its prefill (disaggregated) and its decode: `worker × dp_size +
    /// rank`, as AISimulate numbers its schedulers.
    pub prefill_worker_idx: Option<u32>,
    pub decode_worker_idx: Option<u32>,
    /// Disaggregated serving: the handoff's milestones (see `simulate::handoff`).
    pub prefill_admit_ms: Option<f64>,
    pub source_held_ms: Option<f64>,
    pub destination_reserved_ms: Option<f64>,
    pub destination_activated_ms: Option<f64>,
    pub decode_admit_ms: Option<f64>,
    pub source_released_ms: Option<f64>,
    pub decode_reused_input_tokens: Option<u32>,
    /// The largest prefix hit over the request's prefill admissions in a disaggregated run
    /// under AISimulate's engine, which lists that as the request's reuse (the prefill
    /// compute it saved) where its totals count every admission's.
    #[serde(skip)]
    pub prefill_reused_input_tokens: Option<u32>,
    pub prefill_route_overlap_tokens: Option<u32>,
    pub decode_route_overlap_tokens: Option<u32>,
    pub terminal_status: Status,
}

impl RequestRecord {
    /// Time to first token.
    pub fn ttft(&self) -> Option<f64> {
        Some(self.first_token_ms? - self.arrival_time_ms)
    }

    /// Time from the first token to the second.
    pub fn ttst(&self) -> Option<f64> {
        Some(self.second_token_ms? - self.first_token_ms?)
    }

    /// Arrival to last token.
    pub fn e2e(&self) -> Option<f64> {
        Some(self.last_token_ms? - self.arrival_time_ms)
    }

    /// Mean gap between this request's tokens.
    pub fn tpot(&self) -> Option<f64> {
        if self.output_length < 2 {
            return None;
        }
        Some((self.last_token_ms? - self.first_token_ms?) / f64::from(self.output_length - 1))
    }
}

/// Latency targets for goodput; a request meets them when every given one holds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sla {
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl Sla {
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.itl_ms.is_some() || self.e2e_ms.is_some()
    }

    fn met_by(&self, r: &RequestRecord) -> bool {
        let (Some(ttft), Some(e2e)) = (r.ttft(), r.e2e()) else {
            return false;
        };
        let itl = if r.output_length > 1 {
            (e2e - ttft) / f64::from(r.output_length - 1)
        } else {
            0.0
        };
        self.ttft_ms.is_none_or(|t| ttft <= t)
            && self.e2e_ms.is_none_or(|t| e2e <= t)
            && self.itl_ms.is_none_or(|t| itl <= t)
    }
}

#[derive(Default)]
pub struct Collector {
    pub records: Vec<RequestRecord>,
    /// Prompt tokens the engines' completed passes computed ([`crate::engine::PassOutput::prefill_tokens`]).
    pub prefill_tokens: u64,
    gaps: Gaps,
    /// Whether a folding thread may fold the gaps ([`Collector::beside`]).
    beside: bool,
    /// Gaps not yet folded or handed to the folding thread, in the order they ended.
    batch: Vec<f64>,
    /// The folding thread, once the first batch filled.
    folder: Option<Folder>,
    /// Token-time lists of ended requests, emptied for the next ones: growing a fresh list
    /// per request was a tenth of a simulation, in reallocation and copying.
    spare_times: Vec<Vec<f64>>,
    completed: usize,
}

/// The pooled per-token distributions: every completed request's token gaps, and the output
/// rate each gap stands for.
#[derive(Default)]
struct Gaps {
    itl: Sketch,
    per_user: Sketch,
}

impl Gaps {
    /// Both sketches with their buckets allocated for seven orders of magnitude, where the
    /// folding thread need not grow them.
    fn with_room() -> Gaps {
        Gaps {
            itl: Sketch::with_room(8192),
            per_user: Sketch::with_room(8192),
        }
    }

    /// Folds a batch of gaps, in order: each joins the ITL sketch, and a positive one the
    /// output rate it stands for.
    fn fold(&mut self, batch: &[f64]) {
        self.itl.fold_with(&mut self.per_user, batch, |gap| {
            (gap > 0.0).then(|| 1000.0 / gap)
        });
    }
}

/// One request's token gaps, in order.
fn gaps_of(times: &[f64]) -> impl Iterator<Item = f64> + '_ {
    times.windows(2).map(|pair| (pair[1] - pair[0]).max(0.0))
}

/// Token gaps sent to the folding thread at a time (32 KiB): each batch wakes the thread, a
/// system call that costs about as much as folding a thousand gaps.
const FOLD_BATCH: usize = 4096;

/// The folding thread's stack: it calls nothing deep, so it takes less than the default.
const FOLDER_STACK: usize = 64 << 10;

/// A thread that folds ended requests' token gaps while the simulation goes on: a tenth of a
/// simulation's time, taken off its thread. The gaps go through one channel in batches, so
/// the thread folds them in the order the requests ended, the order the running mean and
/// variance depend on in their last digits; the emptied batches come back.
struct Folder {
    to: Sender<Vec<f64>>,
    back: Receiver<Vec<f64>>,
    thread: std::thread::JoinHandle<Gaps>,
}

impl Folder {
    /// The thread, started; `None` on a single core, or when the system refuses a thread
    /// (the run then folds on its own).
    fn start() -> Option<Folder> {
        if !std::thread::available_parallelism().is_ok_and(|n| n.get() > 1) {
            return None;
        }
        // Two batches waiting at most: the folder is faster than the simulation.
        let (to, work) = bounded::<Vec<f64>>(2);
        // Bounded too, so that its slots are allocated here, once, and not by the folding
        // thread as it sends. Four is room for every batch that can be on its way back.
        let (done, back) = bounded(4);
        let mut gaps = Gaps::with_room();
        let thread = std::thread::Builder::new()
            .name("gap folder".into())
            .stack_size(FOLDER_STACK)
            .spawn(move || {
                for mut batch in work {
                    gaps.fold(&batch);
                    batch.clear();
                    // The simulation may have ended its run already; the batch then goes.
                    let _ = done.send(batch);
                }
                gaps
            })
            .ok()?;
        Some(Folder { to, back, thread })
    }

    /// Hands a full batch over and returns an empty one.
    fn send(&self, batch: Vec<f64>) -> Vec<f64> {
        let next = self
            .back
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(FOLD_BATCH));
        // A send fails only when the thread is gone; `settle` then reports its panic.
        let _ = self.to.send(batch);
        next
    }
}

impl Collector {
    /// A collector that folds the pooled distributions on a thread of its own, where there
    /// is a second core, from the first full batch of gaps on; the run calls
    /// [`Collector::settle`] when it ends, before the summary. A run that ends before then
    /// starts no thread: starting one, and asking the system for its cores, cost a small
    /// simulation more than all its folding.
    pub fn beside() -> Collector {
        Collector {
            beside: true,
            ..Collector::default()
        }
    }

    /// Batches one completed request's gaps.
    fn fold(&mut self, times: &[f64]) {
        for gap in gaps_of(times) {
            if self.batch.len() == FOLD_BATCH {
                self.flush();
            }
            self.batch.push(gap);
        }
    }

    /// Hands the full batch to the folding thread, started by the first, or folds it here.
    /// The thread starts at the first batch or never, so either way every gap is folded in
    /// the order the requests ended.
    fn flush(&mut self) {
        if self.beside && self.folder.is_none() {
            self.folder = Folder::start();
            self.beside = self.folder.is_some();
        }
        match &self.folder {
            Some(folder) => {
                let next = folder.send(std::mem::take(&mut self.batch));
                self.batch = next;
            }
            None => {
                self.gaps.fold(&self.batch);
                self.batch.clear();
            }
        }
    }

    /// Folds the gaps still batched, and waits for the folding thread, if one started, to
    /// fold every batch sent to it.
    pub fn settle(&mut self) {
        self.beside = false;
        let Some(folder) = self.folder.take() else {
            self.gaps.fold(&self.batch);
            self.batch.clear();
            return;
        };
        let batch = std::mem::take(&mut self.batch);
        if !batch.is_empty() {
            // The thread ends only when the sender is dropped, below: it is there to receive.
            let _ = folder.to.send(batch);
        }
        drop(folder.to);
        // Batches still coming back are not needed: the thread's sends then fail, not wait.
        drop(folder.back);
        self.gaps = folder
            .thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    }

    /// Registers an arrived request and returns its id.
    pub fn arrive(
        &mut self,
        session_id: String,
        turn: u32,
        arrival_ms: f64,
        input: u32,
        output: u32,
    ) -> u32 {
        let uuid = self.records.len() as u32;
        self.records.push(RequestRecord {
            session_id,
            turn_index: turn,
            play: None,
            uuid,
            arrival_time_ms: arrival_ms,
            first_admit_ms: None,
            terminal_time_ms: None,
            first_token_ms: None,
            second_token_ms: None,
            last_token_ms: None,
            token_times: Vec::new(),
            input_length: input,
            requested_output_length: output,
            output_length: 0,
            reused_input_tokens: 0,
            first_reused_input_tokens: None,
            prefill_worker_idx: None,
            decode_worker_idx: None,
            prefill_admit_ms: None,
            source_held_ms: None,
            destination_reserved_ms: None,
            destination_activated_ms: None,
            decode_admit_ms: None,
            source_released_ms: None,
            decode_reused_input_tokens: None,
            prefill_reused_input_tokens: None,
            prefill_route_overlap_tokens: None,
            decode_route_overlap_tokens: None,
            terminal_status: Status::Pending,
        });
        uuid
    }

    pub fn admit(&mut self, id: u32, at_ms: f64, reused: u32) {
        let r = &mut self.records[id as usize];
        r.first_admit_ms.get_or_insert(at_ms);
        r.first_reused_input_tokens.get_or_insert(reused);
        r.reused_input_tokens = r.reused_input_tokens.max(reused);
    }

    /// A token at `at_ms`.
    pub fn token(&mut self, id: u32, at_ms: f64) {
        self.tokens(id, std::slice::from_ref(&at_ms));
    }

    /// Tokens at `times_ms`, in order: the passes a worker ran in one step.
    pub fn tokens(&mut self, id: u32, times_ms: &[f64]) {
        let r = &mut self.records[id as usize];
        for &at_ms in times_ms {
            match r.last_token_ms {
                None => r.first_token_ms = Some(at_ms),
                Some(_) if r.output_length == 1 => r.second_token_ms = Some(at_ms),
                Some(_) => {}
            }
            r.last_token_ms = Some(at_ms);
            r.output_length += 1;
        }
        if r.token_times.capacity() == 0 {
            if let Some(spare) = self.spare_times.pop() {
                r.token_times = spare;
            }
        }
        r.token_times.extend_from_slice(times_ms);
    }

    /// The request ended. A completed request's token gaps join the pooled distributions
    /// now, request after request in the order they end, as Dynamo folds them: the running
    /// mean and variance depend on that order in their last digits.
    pub fn finish(&mut self, id: u32, at_ms: f64, status: Status) {
        let r = &mut self.records[id as usize];
        r.terminal_time_ms = Some(at_ms);
        r.terminal_status = status;
        let mut times = std::mem::take(&mut r.token_times);
        if status == Status::Completed {
            self.completed += 1;
            if r.first_admit_ms.is_some() {
                self.fold(&times);
            }
        }
        if times.capacity() > 0 {
            times.clear();
            self.spare_times.push(times);
        }
    }

    /// Requests completed so far.
    pub fn completed(&self) -> usize {
        self.completed
    }
}

/// How the run was provisioned, for the worker-time figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Provision {
    pub prefill_workers: u64,
    pub decode_workers: u64,
    pub prefill_gpus_per_worker: u64,
    pub decode_gpus_per_worker: u64,
    /// Whether each worker is provisioned for the run's duration (at least a nanosecond), as
    /// Dynamo 1.4.2 reports a run with no clock of its own to integrate: one aggregated
    /// worker of one rank offline, and every online run. Otherwise, as its other runs and
    /// AISimulate's integrate their clock, until the last request ended, a rejection
    /// included.
    pub by_duration: bool,
}

/// Exact distribution figures over per-request values.
struct Exact(Vec<f64>);

impl Exact {
    fn new(mut values: Vec<f64>) -> Exact {
        values.sort_by(f64::total_cmp);
        Exact(values)
    }
}

/// A distribution the report can describe in its nine figures.
trait Distribution {
    fn mean(&self) -> f64;
    fn min(&self) -> f64;
    fn max(&self) -> f64;
    /// Population standard deviation.
    fn std(&self) -> f64;
    /// Rounded-rank percentile, `p` in 0..=100.
    fn percentile(&self, p: f64) -> f64;

    fn figures(&self) -> Figures {
        Figures {
            mean: self.mean(),
            min: self.min(),
            max: self.max(),
            median: self.percentile(50.0),
            p75: self.percentile(75.0),
            p90: self.percentile(90.0),
            p95: self.percentile(95.0),
            p99: self.percentile(99.0),
            std: self.std(),
        }
    }
}

impl Distribution for Exact {
    fn percentile(&self, p: f64) -> f64 {
        match self.0.len() {
            0 => 0.0,
            n => self.0[((n - 1) as f64 * p / 100.0).round() as usize],
        }
    }

    fn mean(&self) -> f64 {
        if self.0.is_empty() {
            0.0
        } else {
            self.0.iter().sum::<f64>() / self.0.len() as f64
        }
    }

    fn std(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let mean = self.mean();
        (self.0.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / self.0.len() as f64).sqrt()
    }

    fn min(&self) -> f64 {
        self.0.first().copied().unwrap_or(0.0)
    }

    fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(0.0)
    }
}

impl Distribution for Sketch {
    fn mean(&self) -> f64 {
        Sketch::mean(self)
    }

    fn min(&self) -> f64 {
        Sketch::min(self)
    }

    fn max(&self) -> f64 {
        Sketch::max(self)
    }

    fn std(&self) -> f64 {
        Sketch::std(self)
    }

    fn percentile(&self, p: f64) -> f64 {
        Sketch::percentile(self, p)
    }
}

/// When the last of `records` ended; 0 when none did.
fn last_end<'a>(records: impl IntoIterator<Item = &'a RequestRecord>) -> f64 {
    records
        .into_iter()
        .filter_map(|r| r.terminal_time_ms)
        .fold(0.0, f64::max)
}

impl Collector {
    /// The summary: Dynamo's 74 figures, plus goodput when an SLA is given.
    /// `wall_ms` is the simulation's real time.
    pub fn summary(&self, provision: Provision, wall_ms: f64, sla: Sla) -> Summary {
        debug_assert!(
            self.batch.is_empty() && self.folder.is_none(),
            "every gap is settled first"
        );
        let done: Vec<&RequestRecord> = self
            .records
            .iter()
            .filter(|r| r.terminal_status == Status::Completed)
            .collect();
        // The run's duration (and so its throughputs) ends at the last completed request, in
        // Dynamo 1.4.2's report and AISimulate's alike: a request rejected later does not
        // lengthen it.
        let duration_ms = last_end(done.iter().copied());
        let duration_s = duration_ms / 1e3;
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let per_wall_s = |x: f64| {
            if wall_ms > 0.0 {
                x / (wall_ms / 1e3)
            } else {
                0.0
            }
        };
        let input: u64 = done.iter().map(|r| u64::from(r.input_length)).sum();
        let output: u64 = done.iter().map(|r| u64::from(r.output_length)).sum();
        let reused: u64 = done.iter().map(|r| u64::from(r.reused_input_tokens)).sum();
        let first_reused: u64 = done
            .iter()
            .map(|r| u64::from(r.first_reused_input_tokens.unwrap_or(0)))
            .sum();
        let ratio = |x: u64| {
            if input > 0 {
                x as f64 / input as f64
            } else {
                0.0
            }
        };
        let worker_s = if provision.by_duration {
            (duration_ms / 1e3).max(1e-9)
        } else {
            // The workers are provisioned until the last request ended, whatever its end.
            last_end(&self.records) / 1e3
        };
        let prefill_worker_s = worker_s * provision.prefill_workers as f64;
        let decode_worker_s = worker_s * provision.decode_workers as f64;
        let of = |f: fn(&RequestRecord) -> Option<f64>| {
            Exact::new(done.iter().filter_map(|r| f(r)).collect()).figures()
        };
        let goodput = sla.is_set().then(|| {
            let good: Vec<&&RequestRecord> = done.iter().filter(|r| sla.met_by(r)).collect();
            let good_output: u64 = good.iter().map(|r| u64::from(r.output_length)).sum();
            Goodput {
                completed_requests: good.len() as u64,
                request_throughput_rps: per_s(good.len() as f64),
                output_throughput_tok_s: per_s(good_output as f64),
            }
        });
        Summary {
            num_requests: self.records.len() as u64,
            completed_requests: done.len() as u64,
            total_input_tokens: input,
            total_output_tokens: output,
            duration_ms,
            wall_time_ms: wall_ms,
            request_throughput_rps: per_s(done.len() as f64),
            input_throughput_tok_s: per_s(input as f64),
            output_throughput_tok_s: per_s(output as f64),
            total_throughput_tok_s: per_s((input + output) as f64),
            processed_tokens: input + output,
            processed_tokens_per_s: per_wall_s((input + output) as f64),
            processed_output_tokens_per_s: per_wall_s(output as f64),
            prefill_worker_seconds: prefill_worker_s,
            decode_worker_seconds: decode_worker_s,
            prefill_gpus_per_worker: provision.prefill_gpus_per_worker,
            decode_gpus_per_worker: provision.decode_gpus_per_worker,
            gpu_hours: (prefill_worker_s * provision.prefill_gpus_per_worker as f64
                + decode_worker_s * provision.decode_gpus_per_worker as f64)
                / 3600.0,
            prefix_cache_reused_ratio: ratio(reused),
            first_admission_prefix_cache_reused_ratio: ratio(first_reused),
            ttft_ms: of(RequestRecord::ttft),
            ttst_ms: of(RequestRecord::ttst),
            tpot_ms: of(RequestRecord::tpot),
            e2e_latency_ms: of(RequestRecord::e2e),
            itl_ms: self.gaps.itl.figures(),
            output_token_throughput_per_user: self.gaps.per_user.figures(),
            goodput,
            per_request: None,
            interrupted: false,
            skipped: 0,
            offload: None,
            aisimulate: None,
        }
    }

    /// The keys AISimulate's report adds: the prefill work the passes executed, and how many
    /// completed requests each latency distribution is over (a request of one output token
    /// has no TPOT).
    pub fn aisimulate_figures(&self) -> AisimulateFigures {
        let done = self
            .records
            .iter()
            .filter(|r| r.terminal_status == Status::Completed);
        let count = |f: fn(&RequestRecord) -> Option<f64>| {
            done.clone().filter(|r| f(r).is_some()).count() as u64
        };
        AisimulateFigures {
            committed_prefill_tokens: self.prefill_tokens,
            num_ttft_samples: count(RequestRecord::ttft),
            num_tpot_samples: count(RequestRecord::tpot),
            num_e2e_latency_samples: count(RequestRecord::e2e),
            trajectories: self.trajectories(),
            plays: Vec::new(),
            lifecycle: None,
            graph: None,
        }
    }

    /// The plays of a request graph, or `None` for a trace of conversations. A play
    /// completed when every request of it did.
    fn trajectories(&self) -> Option<Trajectories> {
        // Per play: its first arrival, its last end, whether every request completed.
        let mut plays: BTreeMap<u32, (f64, f64, bool)> = BTreeMap::new();
        for r in &self.records {
            let Some(play) = r.play else { continue };
            let play = plays
                .entry(play)
                .or_insert((f64::INFINITY, f64::NEG_INFINITY, true));
            play.0 = play.0.min(r.arrival_time_ms);
            play.1 = play.1.max(r.terminal_time_ms.unwrap_or(f64::NEG_INFINITY));
            play.2 &= r.terminal_status == Status::Completed;
        }
        if plays.is_empty() {
            return None;
        }
        let spans: Vec<f64> = plays
            .values()
            .filter(|p| p.2)
            .map(|&(first, last, _)| last - first)
            .collect();
        Some(Trajectories {
            total: plays.len() as u64,
            completed: spans.len() as u64,
            e2e_latency_ms: Exact::new(spans).figures(),
        })
    }

    /// kvtrace's per-request views beside the pooled ones: the distribution of each request's
    /// own mean inter-token latency and of its own output rate.
    pub fn per_request(&self) -> PerRequest {
        let done = self
            .records
            .iter()
            .filter(|r| r.terminal_status == Status::Completed);
        let itl = Exact::new(done.clone().filter_map(RequestRecord::tpot).collect());
        let rate = Exact::new(
            done.filter_map(RequestRecord::tpot)
                .filter(|&t| t > 0.0)
                .map(|t| 1000.0 / t)
                .collect(),
        );
        PerRequest {
            itl_ms: itl.figures(),
            output_token_throughput: rate.figures(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// Drives `collector` through requests that overlap and end out of order, some rejected,
    /// some with repeated token times (zero gaps); returns the gaps of the completed ones.
    fn drive(collector: &mut Collector, seed: u64, requests: u32) -> usize {
        let mut rng = SplitMix64::new(seed);
        let (mut live, mut gaps, mut now) = (Vec::new(), 0, 0.0);
        for request in 0..requests {
            let id = collector.arrive(format!("s{request}"), 0, now, 100, 100);
            collector.admit(id, now, 0);
            live.push((id, 1 + rng.range(0, 150) as usize));
            while live.len() > 6 || (request + 1 == requests && !live.is_empty()) {
                let pick = rng.range(0, live.len() as u64 - 1) as usize;
                let (id, tokens) = live.swap_remove(pick);
                for _ in 0..tokens {
                    // A tenth of the gaps repeat a time: a pass that emits two tokens.
                    if rng.range(0, 9) > 0 {
                        now += 5.0 + rng.next_f64() * 40.0;
                    }
                    collector.token(id, now);
                }
                let status = if rng.range(0, 9) == 0 {
                    Status::Rejected
                } else {
                    gaps += tokens - 1;
                    Status::Completed
                };
                collector.finish(id, now, status);
            }
        }
        gaps
    }

    /// Gaps folded on the folding thread give the pooled figures, bit for bit, that folding
    /// them as requests end gives: the same gaps, in the same order, over several batches.
    /// A run whose gaps fill no batch starts no thread and gives them too.
    #[test]
    fn gaps_folded_beside_equal_gaps_folded_in_place() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for (seed, requests) in [(0, 400), (1, 400), (2, 400), (3, 20)] {
            let mut here = Collector::default();
            let mut beside = Collector::beside();
            let gaps = drive(&mut here, seed, requests);
            assert!(gaps > 3 * FOLD_BATCH || (requests < 100 && gaps < FOLD_BATCH));
            assert_eq!(drive(&mut beside, seed, requests), gaps);
            // A batch is handed over when the gap after it arrives.
            assert_eq!(beside.folder.is_some(), gaps > FOLD_BATCH && cores > 1);
            here.settle();
            beside.settle();
            assert!(beside.folder.is_none());
            assert_eq!(here.gaps.itl.count(), gaps as u64);
            assert_eq!(beside.gaps.itl.count(), gaps as u64);
            let summary = |c: &Collector| c.summary(Provision::default(), 1.0, Sla::default());
            let (a, b) = (summary(&here), summary(&beside));
            for (x, y) in [
                (a.itl_ms, b.itl_ms),
                (
                    a.output_token_throughput_per_user,
                    b.output_token_throughput_per_user,
                ),
            ] {
                assert_eq!(format!("{x:?}"), format!("{y:?}"));
                assert_eq!(x.mean.to_bits(), y.mean.to_bits());
                assert_eq!(x.std.to_bits(), y.std.to_bits());
            }
            assert_eq!(here.completed(), beside.completed());
        }
    }
}
