//! What the simulation measures, request by request, and the summary built from it: the
//! 74-key report with the names and definitions serving teams already compare (exact
//! rounded-rank percentiles and population deviation per request; pooled per-token gaps in a
//! sketch), plus kvtrace's per-request averages and SLA goodput.

use serde::Serialize;
use serde_json::{json, Map, Value as Json};

use super::sketch::Sketch;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Completed,
    Rejected,
}

/// One request's life.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    pub session_id: String,
    pub turn_index: u32,
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
    itl: Sketch,
    per_user: Sketch,
}

impl Collector {
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
        let r = &mut self.records[id as usize];
        match r.last_token_ms {
            None => r.first_token_ms = Some(at_ms),
            Some(_) if r.output_length == 1 => r.second_token_ms = Some(at_ms),
            Some(_) => {}
        }
        r.last_token_ms = Some(at_ms);
        r.output_length += 1;
        r.token_times.push(at_ms);
    }

    /// The request ended. A completed request's token gaps join the pooled distributions
    /// now, request after request in the order they end, as Dynamo folds them: the running
    /// mean and variance depend on that order in their last digits.
    pub fn finish(&mut self, id: u32, at_ms: f64, status: Status) {
        let r = &mut self.records[id as usize];
        r.terminal_time_ms = Some(at_ms);
        r.terminal_status = status;
        let times = std::mem::take(&mut r.token_times);
        if status == Status::Completed && r.first_admit_ms.is_some() {
            for pair in times.windows(2) {
                let gap = (pair[1] - pair[0]).max(0.0);
                self.itl.add(gap);
                if gap > 0.0 {
                    self.per_user.add(1000.0 / gap);
                }
            }
        }
    }

    pub fn completed(&self) -> usize {
        self.records
            .iter()
            .filter(|r| r.terminal_status == Status::Completed)
            .count()
    }
}

/// How the run was provisioned, for the worker-time figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Provision {
    pub prefill_workers: u64,
    pub decode_workers: u64,
    pub prefill_gpus_per_worker: u64,
    pub decode_gpus_per_worker: u64,
}

/// Exact distribution figures over per-request values.
struct Exact(Vec<f64>);

impl Exact {
    fn new(mut values: Vec<f64>) -> Exact {
        values.sort_by(f64::total_cmp);
        Exact(values)
    }
}

/// A distribution the report can describe; `figure` maps a report key's statistic
/// (`mean`, `median`, `p90`, ...) onto it.
trait Distribution {
    fn mean(&self) -> f64;
    fn min(&self) -> f64;
    fn max(&self) -> f64;
    /// Population standard deviation.
    fn std(&self) -> f64;
    /// Rounded-rank percentile, `p` in 0..=100.
    fn percentile(&self, p: f64) -> f64;

    fn figure(&self, stat: &str) -> f64 {
        match stat {
            "mean" => self.mean(),
            "min" => self.min(),
            "max" => self.max(),
            "std" => self.std(),
            "median" => self.percentile(50.0),
            p => self.percentile(p[1..].parse().unwrap_or(50.0)),
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

const STATS: [&str; 9] = [
    "mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std",
];

fn put(map: &mut Map<String, Json>, name: &str, suffix: &str, d: &dyn Distribution) {
    for stat in STATS {
        map.insert(format!("{stat}_{name}{suffix}"), json!(d.figure(stat)));
    }
}

impl Collector {
    /// The summary report: Dynamo's 74 keys (plus goodput when an SLA is given), sorted.
    /// `duration_ms` is virtual; `wall_ms` is the simulation's real time.
    pub fn summary(&self, provision: Provision, wall_ms: f64, sla: Sla) -> Map<String, Json> {
        let done: Vec<&RequestRecord> = self
            .records
            .iter()
            .filter(|r| r.terminal_status == Status::Completed)
            .collect();
        let duration_ms = self
            .records
            .iter()
            .filter_map(|r| r.terminal_time_ms)
            .fold(0.0, f64::max);
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
        let prefill_worker_s = duration_s * provision.prefill_workers as f64;
        let decode_worker_s = duration_s * provision.decode_workers as f64;
        let mut m = Map::new();
        m.insert("num_requests".into(), json!(self.records.len()));
        m.insert("completed_requests".into(), json!(done.len()));
        m.insert("total_input_tokens".into(), json!(input));
        m.insert("total_output_tokens".into(), json!(output));
        m.insert("duration_ms".into(), json!(duration_ms));
        m.insert("wall_time_ms".into(), json!(wall_ms));
        m.insert(
            "request_throughput_rps".into(),
            json!(per_s(done.len() as f64)),
        );
        m.insert("input_throughput_tok_s".into(), json!(per_s(input as f64)));
        m.insert(
            "output_throughput_tok_s".into(),
            json!(per_s(output as f64)),
        );
        m.insert(
            "total_throughput_tok_s".into(),
            json!(per_s((input + output) as f64)),
        );
        m.insert("processed_tokens".into(), json!(input + output));
        m.insert(
            "processed_tokens_per_s".into(),
            json!(per_wall_s((input + output) as f64)),
        );
        m.insert(
            "processed_output_tokens_per_s".into(),
            json!(per_wall_s(output as f64)),
        );
        m.insert("prefill_worker_seconds".into(), json!(prefill_worker_s));
        m.insert("decode_worker_seconds".into(), json!(decode_worker_s));
        m.insert(
            "prefill_gpus_per_worker".into(),
            json!(provision.prefill_gpus_per_worker),
        );
        m.insert(
            "decode_gpus_per_worker".into(),
            json!(provision.decode_gpus_per_worker),
        );
        m.insert(
            "gpu_hours".into(),
            json!(
                (prefill_worker_s * provision.prefill_gpus_per_worker as f64
                    + decode_worker_s * provision.decode_gpus_per_worker as f64)
                    / 3600.0
            ),
        );
        m.insert("prefix_cache_reused_ratio".into(), json!(ratio(reused)));
        m.insert(
            "first_admission_prefix_cache_reused_ratio".into(),
            json!(ratio(first_reused)),
        );
        let of = |f: fn(&RequestRecord) -> Option<f64>| {
            Exact::new(done.iter().filter_map(|r| f(r)).collect())
        };
        put(&mut m, "ttft", "_ms", &of(RequestRecord::ttft));
        put(&mut m, "ttst", "_ms", &of(RequestRecord::ttst));
        put(&mut m, "tpot", "_ms", &of(RequestRecord::tpot));
        put(&mut m, "e2e_latency", "_ms", &of(RequestRecord::e2e));
        put(&mut m, "itl", "_ms", &self.itl);
        m.insert("max_itl_ms".into(), json!(self.itl.max()));
        put(
            &mut m,
            "output_token_throughput_per_user",
            "",
            &self.per_user,
        );
        if sla.is_set() {
            let good: Vec<&&RequestRecord> = done.iter().filter(|r| sla.met_by(r)).collect();
            let good_output: u64 = good.iter().map(|r| u64::from(r.output_length)).sum();
            m.insert("goodput_completed_requests".into(), json!(good.len()));
            m.insert(
                "goodput_request_throughput_rps".into(),
                json!(per_s(good.len() as f64)),
            );
            m.insert(
                "goodput_output_throughput_tok_s".into(),
                json!(per_s(good_output as f64)),
            );
        }
        m.sort_keys();
        m
    }

    /// kvtrace's per-request views beside the pooled ones: the distribution of each request's
    /// own mean inter-token latency and of its own output rate.
    pub fn per_request_extras(&self) -> Map<String, Json> {
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
        let mut m = Map::new();
        put(&mut m, "per_request_itl", "_ms", &itl);
        put(&mut m, "per_request_output_token_throughput", "", &rate);
        m.sort_keys();
        m
    }
}
