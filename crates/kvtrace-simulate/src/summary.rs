//! The simulation's summary as a type: Dynamo's 74 figures, kvtrace's optional per-request
//! views, SLA goodput, KV-offload counters and, under AISimulate's engine, its own keys. It
//! serializes to the flat, sorted keys Dynamo's report has (`mean_ttft_ms`, `p99_itl_ms`, ...
//! `offload_hit_rate`), so scripts that read Dynamo's JSON read kvtrace's unchanged; code
//! reads the fields.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value as Json};

use crate::agentic_identity::GraphIdentity;
use crate::collector::Status;
use crate::storage::TierStats;
use crate::tier_link::LinkSummary;

/// The nine figures the report gives for every distribution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Figures {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    pub median: f64,
    pub p75: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    /// Population standard deviation.
    pub std: f64,
}

/// Requests that met the SLA and the rates they give.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Goodput {
    pub completed_requests: u64,
    pub request_throughput_rps: f64,
    pub output_throughput_tok_s: f64,
}

/// kvtrace's per-request views beside the pooled ones: each request's own mean inter-token
/// latency and its own output rate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerRequest {
    pub itl_ms: Figures,
    pub output_token_throughput: Figures,
}

/// What the shared KV store did for the engines; its keys carry the `offload_` prefix.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OffloadSummary {
    pub chunk_tokens: u32,
    pub lookups: u64,
    pub lookup_chunks: u64,
    pub hit_chunks: u64,
    pub l1_hit_chunks: u64,
    pub l2_hit_chunks: u64,
    pub hit_rate: f64,
    pub l1_hit_rate: f64,
    pub l2_hit_rate: f64,
    pub loaded_tokens: u64,
    pub loaded_bytes: u64,
    pub load_ms: f64,
    pub stored_chunks: u64,
    pub store_out_of_memory: u64,
    pub tiers: Vec<TierStats>,
    /// The L2 tier as a measured link (`--offload-calibration`); absent with the fixed
    /// bandwidth model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l2_link: Option<LinkSummary>,
}

/// A finished simulation's figures. `duration_ms` is virtual time; `wall_time_ms` is how long
/// the simulation itself took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub num_requests: u64,
    pub completed_requests: u64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub duration_ms: f64,
    pub wall_time_ms: f64,
    pub request_throughput_rps: f64,
    pub input_throughput_tok_s: f64,
    pub output_throughput_tok_s: f64,
    pub total_throughput_tok_s: f64,
    pub processed_tokens: u64,
    pub processed_tokens_per_s: f64,
    pub processed_output_tokens_per_s: f64,
    pub prefill_worker_seconds: f64,
    pub decode_worker_seconds: f64,
    pub prefill_gpus_per_worker: u64,
    pub decode_gpus_per_worker: u64,
    pub gpu_hours: f64,
    pub prefix_cache_reused_ratio: f64,
    pub first_admission_prefix_cache_reused_ratio: f64,
    pub ttft_ms: Figures,
    pub ttst_ms: Figures,
    pub tpot_ms: Figures,
    pub e2e_latency_ms: Figures,
    /// Pooled gaps between consecutive tokens of every request.
    pub itl_ms: Figures,
    pub output_token_throughput_per_user: Figures,
    /// Present when an SLA was given.
    pub goodput: Option<Goodput>,
    /// Present when asked for.
    pub per_request: Option<PerRequest>,
    /// A signal stopped the simulation; the figures cover what ran.
    pub interrupted: bool,
    /// Requests of a request graph never sent because one they wait for was rejected
    /// (under AISimulate's engine, which skips them).
    pub skipped: u64,
    /// Present when the engines shared a KV store.
    pub offload: Option<OffloadSummary>,
    /// Present when the engines follow AISimulate 0.13 (`engine_version: aisimulate-0.13`).
    pub aisimulate: Option<AisimulateFigures>,
}

/// The keys AISimulate's engine adds to Dynamo's report: its KV eviction policy, the
/// prefill work its passes executed and how many requests each latency figure is over (its
/// power keys, which a polynomial timing model has no evidence for, are written as null,
/// as AISimulate writes them then).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AisimulateFigures {
    /// Prompt tokens the completed passes computed, recomputation included.
    pub committed_prefill_tokens: u64,
    pub num_ttft_samples: u64,
    pub num_tpot_samples: u64,
    pub num_e2e_latency_samples: u64,
    /// Present for a request graph (agentic, weka): its plays.
    pub trajectories: Option<Trajectories>,
    /// For a request graph, how each play ended, in AISimulate's order of plays.
    pub plays: Vec<PlayOutcome>,
    /// For a request graph, its lifecycle transcript's length and digest
    /// ([`crate::lifecycle`]).
    pub lifecycle: Option<(u64, String)>,
    /// For a request graph, its provenance and digest.
    pub graph: Option<GraphIdentity>,
}

/// How one play of a request graph ended, as AISimulate's driver settles it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlayEnd {
    pub status: PlayStatus,
    /// When its first rejection (or failure) came, else when its last request ended (none
    /// ended: `None`).
    pub causal_terminal_ms: Option<f64>,
    /// When its last request sent ended, once no request of it is waiting or running.
    pub settled_at_ms: Option<f64>,
    /// The session whose request's end failed the play (rejected, or failed at its
    /// handoff), and that end: the earliest, then the first.
    pub failure: Option<(u32, Status)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlayStatus {
    /// Every request completed.
    Completed,
    /// A request was rejected (or failed at its handoff), and no request of the play is
    /// left running.
    Failed,
    /// A request is still waiting or running, or was never sent (the run was stopped, or
    /// the engines could schedule nothing more).
    Incomplete,
}

impl PlayStatus {
    fn name(self) -> &'static str {
        match self {
            PlayStatus::Completed => "completed",
            PlayStatus::Failed => "failed",
            PlayStatus::Incomplete => "incomplete",
        }
    }
}

/// One play's end under its name, an entry of AISimulate's `agentic_play_outcomes`.
#[derive(Clone, Debug, PartialEq)]
pub struct PlayOutcome {
    /// Its `play_id` ([`crate::workload::Graph::play_names`]).
    pub play_id: String,
    pub end: PlayEnd,
    /// The `request_id` of the request whose end failed the play.
    pub failure_request_id: Option<String>,
}

impl PlayOutcome {
    /// The entry as AISimulate writes it: the times and the failure only where known.
    fn to_json(&self) -> Json {
        let mut m = Map::new();
        m.insert("play_id".into(), self.play_id.clone().into());
        m.insert("status".into(), self.end.status.name().into());
        let times = [
            ("causal_terminal_ms", self.end.causal_terminal_ms),
            ("settled_at_ms", self.end.settled_at_ms),
        ];
        for (key, at) in times {
            if let Some(at) = at {
                m.insert(key.into(), at.into());
            }
        }
        if let Some(id) = &self.failure_request_id {
            m.insert("failure_request_id".into(), id.clone().into());
        }
        if let Some((_, status)) = self.end.failure {
            m.insert("failure_status".into(), status.name().into());
        }
        Json::Object(m)
    }

    /// The entry as a table's row: every column, in the JSON's order, empty where the JSON
    /// leaves a key out.
    pub(crate) fn to_row(&self) -> Json {
        let entry = self.to_json();
        let columns = [
            "play_id",
            "status",
            "causal_terminal_ms",
            "settled_at_ms",
            "failure_request_id",
            "failure_status",
        ];
        let row: Map<String, Json> = columns
            .iter()
            .map(|&c| (c.to_owned(), entry.get(c).cloned().unwrap_or(Json::Null)))
            .collect();
        Json::Object(row)
    }
}

/// A request graph's plays (*trajectories*): how many there were, how many completed every
/// request, and the distribution of a completed one's span, from its first request's
/// arrival to its last request's end.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Trajectories {
    pub total: u64,
    pub completed: u64,
    pub e2e_latency_ms: Figures,
}

/// The report's flat keys, sorted as Dynamo writes them.
struct Keys(BTreeMap<String, Json>);

impl Keys {
    fn put(&mut self, key: impl Into<String>, value: impl Into<Json>) {
        self.0.insert(key.into(), value.into());
    }

    /// `{stat}_{stem}{suffix}` for each of the nine figures: `mean_ttft_ms`, `p99_ttft_ms`.
    fn figures(&mut self, stem: &str, suffix: &str, f: &Figures) {
        let stats = [
            ("mean", f.mean),
            ("min", f.min),
            ("max", f.max),
            ("median", f.median),
            ("p75", f.p75),
            ("p90", f.p90),
            ("p95", f.p95),
            ("p99", f.p99),
            ("std", f.std),
        ];
        for (stat, v) in stats {
            self.put(format!("{stat}_{stem}{suffix}"), v);
        }
    }
}

impl Summary {
    fn keys(&self) -> Keys {
        let mut k = Keys(BTreeMap::new());
        k.put("num_requests", self.num_requests);
        k.put("completed_requests", self.completed_requests);
        k.put("total_input_tokens", self.total_input_tokens);
        k.put("total_output_tokens", self.total_output_tokens);
        k.put("duration_ms", self.duration_ms);
        k.put("wall_time_ms", self.wall_time_ms);
        k.put("request_throughput_rps", self.request_throughput_rps);
        k.put("input_throughput_tok_s", self.input_throughput_tok_s);
        k.put("output_throughput_tok_s", self.output_throughput_tok_s);
        k.put("total_throughput_tok_s", self.total_throughput_tok_s);
        k.put("processed_tokens", self.processed_tokens);
        k.put("processed_tokens_per_s", self.processed_tokens_per_s);
        k.put(
            "processed_output_tokens_per_s",
            self.processed_output_tokens_per_s,
        );
        k.put("prefill_worker_seconds", self.prefill_worker_seconds);
        k.put("decode_worker_seconds", self.decode_worker_seconds);
        k.put("prefill_gpus_per_worker", self.prefill_gpus_per_worker);
        k.put("decode_gpus_per_worker", self.decode_gpus_per_worker);
        k.put("gpu_hours", self.gpu_hours);
        k.put("prefix_cache_reused_ratio", self.prefix_cache_reused_ratio);
        k.put(
            "first_admission_prefix_cache_reused_ratio",
            self.first_admission_prefix_cache_reused_ratio,
        );
        k.figures("ttft", "_ms", &self.ttft_ms);
        k.figures("ttst", "_ms", &self.ttst_ms);
        k.figures("tpot", "_ms", &self.tpot_ms);
        k.figures("e2e_latency", "_ms", &self.e2e_latency_ms);
        k.figures("itl", "_ms", &self.itl_ms);
        k.figures(
            "output_token_throughput_per_user",
            "",
            &self.output_token_throughput_per_user,
        );
        if let Some(g) = &self.goodput {
            k.put("goodput_completed_requests", g.completed_requests);
            k.put("goodput_request_throughput_rps", g.request_throughput_rps);
            k.put("goodput_output_throughput_tok_s", g.output_throughput_tok_s);
        }
        if let Some(p) = &self.per_request {
            k.figures("per_request_itl", "_ms", &p.itl_ms);
            k.figures(
                "per_request_output_token_throughput",
                "",
                &p.output_token_throughput,
            );
        }
        if self.interrupted {
            k.put("interrupted", true);
        }
        if let Some(a) = &self.aisimulate {
            // Every engine here evicts the least recently used unreferenced block or node.
            k.put("kv_eviction_policy", "lru");
            k.put("committed_prefill_tokens", a.committed_prefill_tokens);
            k.put("num_ttft_samples", a.num_ttft_samples);
            k.put("num_tpot_samples", a.num_tpot_samples);
            k.put("num_e2e_latency_samples", a.num_e2e_latency_samples);
            k.put("power_w", Json::Null);
            k.put("power_coverage", Json::Null);
            if let Some(t) = &a.trajectories {
                k.put("total_trajectories", t.total);
                k.put("completed_trajectories", t.completed);
                k.put("incomplete_trajectories", t.total - t.completed);
                k.figures("trajectory_e2e_latency", "_ms", &t.e2e_latency_ms);
                // AISimulate writes the median under both names.
                k.put("p50_trajectory_e2e_latency_ms", t.e2e_latency_ms.median);
            }
            if let Some(graph) = &a.graph {
                k.put("agentic_graph", graph.to_json());
            }
            if let Some((events, digest)) = &a.lifecycle {
                k.put("agentic_lifecycle_event_count", *events);
                k.put("agentic_lifecycle_digest", digest.as_str());
            }
            if !a.plays.is_empty() {
                let plays = a.plays.iter().map(PlayOutcome::to_json).collect();
                k.put("agentic_play_outcomes", Json::Array(plays));
            }
        }
        if let Some(Json::Object(offload)) = self
            .offload
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok())
        {
            for (key, v) in offload {
                k.put(format!("offload_{key}"), v);
            }
        }
        k
    }
}

impl Summary {
    /// The flat keys, sorted, as the JSON report and the Summary table have them.
    pub fn to_map(&self) -> Map<String, Json> {
        self.keys().0.into_iter().collect()
    }
}

impl Serialize for Summary {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.keys().0.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(s: &Summary) -> Vec<String> {
        s.to_map().keys().cloned().collect()
    }

    #[test]
    fn the_plain_summary_has_dynamos_74_keys_sorted() {
        let k = keys(&Summary::default());
        assert_eq!(k.len(), 74);
        let mut sorted = k.clone();
        sorted.sort();
        assert_eq!(k, sorted);
        assert!(k.contains(&"p99_itl_ms".to_string()));
        assert!(k.contains(&"median_output_token_throughput_per_user".to_string()));
        assert!(!k
            .iter()
            .any(|k| k.starts_with("goodput") || k == "interrupted"));
    }

    #[test]
    fn optional_parts_add_their_keys() {
        let s = Summary {
            goodput: Some(Goodput::default()),
            per_request: Some(PerRequest::default()),
            interrupted: true,
            offload: Some(OffloadSummary::default()),
            aisimulate: Some(AisimulateFigures::default()),
            ..Summary::default()
        };
        let k = keys(&s);
        assert_eq!(k.len(), 74 + 3 + 18 + 1 + 15 + 7);
        assert_eq!(s.to_map()["power_w"], Json::Null);
        assert!(k.contains(&"offload_tiers".to_string()));
        assert!(k.contains(&"p90_per_request_itl_ms".to_string()));
    }

    #[test]
    fn counts_stay_integers_and_times_stay_floats() {
        let s = Summary {
            num_requests: 3,
            duration_ms: 2.0,
            ..Summary::default()
        };
        let v = serde_json::to_value(&s).unwrap_or_default();
        assert!(v["num_requests"].is_u64());
        assert!(v["duration_ms"].is_f64());
    }
}
