//! The L2 tier of a simulated KV offload as the shared link it is: every engine's loads and
//! stores go through the same `lanes` (the tier's connections or I/O workers), each call takes
//! the time the real tier was measured to take for its bytes ([`Cost`], fitted by `kvtrace
//! replay` and `kvtrace bench`), and a call that finds every lane busy waits for the first to
//! free. A load waits for its chunks before its pass can run; a store is asynchronous, as
//! LMCache's are, so it costs its pass nothing but holds a lane — the loads behind it wait.
//!
//! Lanes are served in time order and ties go to the lowest lane, so a simulation stays
//! deterministic.

use serde::Serialize;
use serde_json::Value;

use crate::storage::Cost;

/// How the L2 link moves data: per-call costs and how many calls run at once.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkConfig {
    pub read: Cost,
    pub write: Cost,
    pub lanes: u32,
    /// Where the costs came from: the report and the tier in it.
    pub source: String,
}

impl LinkConfig {
    /// The costs of the first measured tier in a `kvtrace replay` summary (`kvtrace.tier_io`)
    /// or a `kvtrace bench` report (`storage_io`): the first object in document order with
    /// `read_cost` and `write_cost`, skipping modelled (GPU budget) tiers. Its lanes are the
    /// tier's I/O workers, one for synchronous I/O. `origin` names the file in errors.
    pub fn from_report(report: &Value, origin: &str) -> Result<LinkConfig, String> {
        let (path, calls, owner) = find_costs(report, "", None).ok_or_else(|| {
            format!(
                "{origin}: no measured tier (read_cost and write_cost) in this report: give the JSON report of `kvtrace replay` or `kvtrace bench` run with an fs, redis or s3 tier"
            )
        })?;
        let cost = |key: &str| -> Result<Cost, String> {
            let v = &calls[key];
            if v.is_null() {
                let what = if key == "read_cost" {
                    "reads"
                } else {
                    "writes"
                };
                return Err(format!(
                    "{origin}: {path}.{key}: the run measured no {what} on this tier: calibrate with a run that both stores to and loads from it"
                ));
            }
            let cost: Cost = serde_json::from_value(v.clone())
                .map_err(|e| format!("{origin}: {path}.{key}: {e}"))?;
            let sound = cost.mib_per_s.is_finite()
                && cost.mib_per_s > 0.0
                && cost.latency_ms.is_finite()
                && cost.latency_ms >= 0.0;
            if !sound {
                return Err(format!(
                    "{origin}: {path}.{key}: latency_ms must be finite and at least 0 and mib_per_s finite and above 0"
                ));
            }
            Ok(cost)
        };
        let (read, write) = (cost("read_cost")?, cost("write_cost")?);
        let lanes = match owner.get("workers") {
            None | Some(Value::Null) => 1,
            Some(w) => w
                .as_u64()
                .filter(|&w| (1..=4096).contains(&w))
                .ok_or_else(|| format!("{origin}: {path}.workers: not a count from 1 to 4096"))?
                as u32,
        };
        let tier = owner
            .get("name")
            .and_then(Value::as_str)
            .map_or(String::new(), |n| format!(" ({})", n.escape_debug()));
        Ok(LinkConfig {
            read,
            write,
            lanes,
            source: format!("{origin}: {path}{tier}"),
        })
    }
}

/// The first object holding both costs, its path, and the object that describes its tier:
/// itself (bench's `storage_io`, flattened) or its parent (replay's `tier_io[i]`, whose
/// `calls` hold them).
fn find_costs<'a>(
    v: &'a Value,
    path: &str,
    parent: Option<&'a Value>,
) -> Option<(String, &'a Value, &'a Value)> {
    match v {
        Value::Object(map) => {
            if map.contains_key("read_cost") && map.contains_key("write_cost") {
                let owner = match parent {
                    Some(p) if !map.contains_key("workers") => p,
                    _ => v,
                };
                if owner.get("mode").and_then(Value::as_str) != Some("modelled") {
                    return Some((path.to_owned(), v, owner));
                }
                return None;
            }
            map.iter().find_map(|(k, child)| {
                // Keys are the report's text: escaped, as they may reach a terminal.
                let k = k.escape_debug();
                let p = if path.is_empty() {
                    k.to_string()
                } else {
                    format!("{path}.{k}")
                };
                find_costs(child, &p, Some(v))
            })
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, child)| find_costs(child, &format!("{path}[{i}]"), parent)),
        _ => None,
    }
}

/// What the link did, for the report (`offload_l2_link`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LinkSummary {
    pub source: String,
    pub lanes: u32,
    pub read_latency_ms: f64,
    pub read_mib_per_s: f64,
    pub write_latency_ms: f64,
    pub write_mib_per_s: f64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Time loads waited for a free lane (behind stores or other loads), summed over calls.
    pub read_wait_ms: f64,
    /// Time the lanes spent on calls, and that over the lanes and the span of simulated time
    /// from the first call to the last one's end.
    pub busy_ms: f64,
    pub utilization: f64,
}

/// The link's state: when each lane frees.
pub struct Link {
    config: LinkConfig,
    free_at: Vec<f64>,
    first_ms: Option<f64>,
    last_end_ms: f64,
    summary: LinkSummary,
}

impl Link {
    pub fn new(config: LinkConfig) -> Link {
        let summary = LinkSummary {
            source: config.source.clone(),
            lanes: config.lanes,
            read_latency_ms: config.read.latency_ms,
            read_mib_per_s: config.read.mib_per_s,
            write_latency_ms: config.write.latency_ms,
            write_mib_per_s: config.write.mib_per_s,
            ..LinkSummary::default()
        };
        Link {
            free_at: vec![0.0; config.lanes.max(1) as usize],
            config,
            first_ms: None,
            last_end_ms: 0.0,
            summary,
        }
    }

    /// Puts a call of `ms` on the lane that frees first; returns (start, end).
    fn occupy(&mut self, now: f64, ms: f64) -> (f64, f64) {
        let (lane, &free) = self
            .free_at
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .expect("at least one lane");
        let start = now.max(free);
        let end = start + ms;
        self.free_at[lane] = end;
        self.first_ms = Some(self.first_ms.map_or(now, |f| f.min(now)));
        self.last_end_ms = self.last_end_ms.max(end);
        self.summary.busy_ms += ms;
        (start, end)
    }

    /// A load of `bytes` issued at `now`: when it has arrived.
    pub fn read(&mut self, now: f64, bytes: u64) -> f64 {
        let (start, end) = self.occupy(now, self.config.read.ms(bytes));
        self.summary.reads += 1;
        self.summary.bytes_read += bytes;
        self.summary.read_wait_ms += start - now;
        end
    }

    /// A store of `bytes` issued at `now`; nobody waits for it.
    pub fn write(&mut self, now: f64, bytes: u64) {
        self.occupy(now, self.config.write.ms(bytes));
        self.summary.writes += 1;
        self.summary.bytes_written += bytes;
    }

    pub fn summary(&self) -> LinkSummary {
        let span = self.first_ms.map_or(0.0, |f| self.last_end_ms - f);
        let lanes = f64::from(self.config.lanes.max(1));
        LinkSummary {
            utilization: if span > 0.0 {
                self.summary.busy_ms / (lanes * span)
            } else {
                0.0
            },
            ..self.summary.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cost(latency_ms: f64, mib_per_s: f64) -> Cost {
        Cost {
            calls: 1,
            mean_bytes: 1.0,
            one_size: false,
            latency_ms,
            mib_per_s,
        }
    }

    fn link(lanes: u32) -> Link {
        // 1 ms a call plus 1 MiB per ms: a 1 MiB call takes 2 ms.
        Link::new(LinkConfig {
            read: cost(1.0, 1000.0),
            write: cost(1.0, 1000.0),
            lanes,
            source: "test".into(),
        })
    }

    #[test]
    fn loads_behind_a_store_wait_for_its_lane() {
        let mib = 1 << 20;
        let mut l = link(1);
        l.write(0.0, mib);
        // The store holds the only lane until 2 ms; the load runs 2..4.
        assert_eq!(l.read(0.5, mib), 4.0);
        let s = l.summary();
        assert_eq!((s.reads, s.writes), (1, 1));
        assert!((s.read_wait_ms - 1.5).abs() < 1e-12);
        assert!((s.utilization - 1.0).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn lanes_serve_calls_at_once() {
        let mib = 1 << 20;
        let mut l = link(2);
        assert_eq!(l.read(0.0, mib), 2.0);
        assert_eq!(l.read(0.0, mib), 2.0);
        // The third waits for the first lane to free.
        assert_eq!(l.read(0.0, mib), 4.0);
        assert!((l.summary().utilization - 0.75).abs() < 1e-12);
    }

    fn costs() -> Value {
        json!({"calls": 8, "mean_bytes": 1024.0, "one_size": true, "latency_ms": 0.0, "mib_per_s": 50.0})
    }

    #[test]
    fn a_replay_summary_names_its_tier_and_workers() {
        let report = json!({"kvtrace": {"tier_io": [
            {"name": "L1", "mode": "modelled", "workers": null,
             "calls": {"read_cost": costs(), "write_cost": costs()}},
            {"name": "L2[0]", "mode": "asynchronous", "workers": 4,
             "calls": {"read_cost": costs(), "write_cost": costs()}}
        ]}});
        let c = LinkConfig::from_report(&report, "r.json").expect("costs");
        assert_eq!(c.lanes, 4);
        assert_eq!(c.source, "r.json: kvtrace.tier_io[1].calls (L2[0])");
        assert_eq!(c.read.mib_per_s, 50.0);
    }

    #[test]
    fn a_bench_report_holds_them_flattened() {
        let report = json!({"storage_io": {"mode": "synchronous", "workers": null,
            "read_cost": costs(), "write_cost": costs()}});
        let c = LinkConfig::from_report(&report, "b.json").expect("costs");
        assert_eq!((c.lanes, c.source.as_str()), (1, "b.json: storage_io"));
    }

    #[test]
    fn missing_or_bad_costs_are_named() {
        let err = |v: Value| LinkConfig::from_report(&v, "x.json").expect_err("refused");
        assert!(err(json!({"a": 1})).starts_with("x.json: no measured tier"));
        let e = err(json!({"s": {"read_cost": null, "write_cost": costs()}}));
        assert!(
            e.starts_with("x.json: s.read_cost: the run measured no reads"),
            "{e}"
        );
        let mut bad = costs();
        bad["mib_per_s"] = json!(0.0);
        let e = err(json!({"s": {"read_cost": costs(), "write_cost": bad}}));
        assert!(
            e.starts_with("x.json: s.write_cost: latency_ms must be"),
            "{e}"
        );
        let e = err(json!({"s": {"read_cost": costs(), "write_cost": {"calls": "x"}}}));
        assert!(e.starts_with("x.json: s.write_cost: invalid type"), "{e}");
        let e = err(json!({"s": {"read_cost": costs(), "write_cost": costs(), "workers": 0}}));
        assert!(e.starts_with("x.json: s.workers: not a count"), "{e}");
    }
}
