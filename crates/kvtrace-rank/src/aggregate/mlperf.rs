//! MLPerf Storage v3.0's run summary (its `Rules.md` §6.3.4): the bench results of every
//! rank of every trial of every Option, laid out as `option_<O>/trial_<T>/rank_<N>/
//! kvcache_results_*.json`, reduced to `kvcache_run_summary.json`'s keys. Within a trial the
//! ranks' storage bandwidths and throughputs are summed; over the trials those sums are
//! averaged; the device P95s are the largest of any rank in any trial (a worst-client
//! bound, not a pooled percentile). A rank whose result is missing or unreadable is listed
//! and marks the Option a partial failure; it is never silently dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value as Json;

use super::read_report;
use crate::error::{Error, Result};
use crate::report::{Cell, JsonStyle, Report, Table};

/// The most ranks a trial's results may claim: past it a forged world size is refused, not
/// walked.
const MAX_RANKS: u32 = 1 << 20;

/// What MLPerf reads from one rank's result (`summary` and its `cache_stats`), and
/// kvtrace's storage-only figures beside it; a figure the result lacks counts as 0, as
/// MLPerf's aggregation takes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct RankFigures {
    pub read_gbps: f64,
    pub write_gbps: f64,
    pub avg_tokens_per_s: f64,
    pub storage_tokens_per_s: f64,
    pub device_read_p95_ms: f64,
    pub device_write_p95_ms: f64,
    pub storage_entries: u64,
    pub cached_tokens_per_s: f64,
    pub device_read_p95_ms_with_demotions: f64,
    pub device_write_p95_ms_with_demotions: f64,
}

impl RankFigures {
    pub(super) fn read(doc: &Json) -> RankFigures {
        let number = |path: &str| doc.pointer(path).and_then(Json::as_f64).unwrap_or(0.0);
        let stats = |key: &str| number(&format!("/summary/cache_stats/{key}"));
        let with_demotions = |dir: &str| {
            doc.pointer("/kvtrace/latency_with_demotions")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
                .find(|l| l["tier"] == "storage" && l["direction"] == dir)
                .and_then(|l| l["device_p95_ms"].as_f64())
                .unwrap_or(0.0)
        };
        RankFigures {
            read_gbps: stats("tier_storage_read_bandwidth_gbps"),
            write_gbps: stats("tier_storage_write_bandwidth_gbps"),
            avg_tokens_per_s: number("/summary/avg_throughput_tokens_per_sec"),
            storage_tokens_per_s: number("/summary/storage_throughput_tokens_per_sec"),
            device_read_p95_ms: stats("storage_read_device_p95_ms"),
            device_write_p95_ms: stats("storage_write_device_p95_ms"),
            storage_entries: doc
                .pointer("/summary/cache_stats/storage_entries")
                .and_then(Json::as_u64)
                .unwrap_or(0),
            cached_tokens_per_s: number("/kvtrace/cached_tokens_per_sec"),
            device_read_p95_ms_with_demotions: with_demotions("read"),
            device_write_p95_ms_with_demotions: with_demotions("write"),
        }
    }

    /// Whether the rank served everything from memory: its device latencies say nothing.
    pub(super) fn cpu_tier_only(&self) -> bool {
        self.storage_entries == 0
    }
}

/// One trial's ranks reduced: sums, and the largest device P95s.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct TrialFigures {
    pub trial: u32,
    /// Ranks whose result was read.
    pub ranks: u32,
    pub read_bandwidth_gbps: f64,
    pub write_bandwidth_gbps: f64,
    pub avg_throughput_tokens_per_sec: f64,
    pub storage_throughput_tokens_per_sec: f64,
    pub cached_tokens_per_sec: f64,
    pub device_read_p95_ms: f64,
    pub device_write_p95_ms: f64,
}

impl TrialFigures {
    /// Folds one rank in: its figures summed, its device P95s the largest so far unless it
    /// served everything from memory.
    pub(super) fn add(&mut self, r: &RankFigures) {
        self.ranks += 1;
        self.read_bandwidth_gbps += r.read_gbps;
        self.write_bandwidth_gbps += r.write_gbps;
        self.avg_throughput_tokens_per_sec += r.avg_tokens_per_s;
        self.storage_throughput_tokens_per_sec += r.storage_tokens_per_s;
        self.cached_tokens_per_sec += r.cached_tokens_per_s;
        if !r.cpu_tier_only() {
            self.device_read_p95_ms = self.device_read_p95_ms.max(r.device_read_p95_ms);
            self.device_write_p95_ms = self.device_write_p95_ms.max(r.device_write_p95_ms);
        }
    }
}

/// kvtrace's figures beside MLPerf's in an Option's entry.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OptionExtras {
    /// `closed` when every rank of every trial ran with the rules' values, else `open`.
    pub division: String,
    /// Storage-only throughput (tokens read back from the storage tier per second): summed
    /// within a trial, averaged over trials.
    pub cached_tokens_per_sec: f64,
    /// The largest device P95 of any rank in any trial with demotion I/O included.
    pub device_read_p95_ms_with_demotions: f64,
    pub device_write_p95_ms_with_demotions: f64,
    pub trials: Vec<TrialFigures>,
}

/// One Option's entry of `kvcache_run_summary.json`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OptionSummary {
    pub option: u32,
    pub aggregated_read_bandwidth_gbps: f64,
    pub aggregated_write_bandwidth_gbps: f64,
    pub aggregated_avg_throughput_tokens_per_sec: f64,
    pub aggregated_storage_throughput_tokens_per_sec: f64,
    /// The largest per-rank device read P95 over every rank and trial (ms).
    pub aggregated_device_read_p95_ms: f64,
    pub aggregated_device_write_p95_ms: f64,
    pub rank_count: u32,
    pub trial_count: u32,
    pub partial_failure: bool,
    /// Rank directories without a readable result.
    pub missing_files: Vec<String>,
    /// Results of ranks that held nothing in the storage tier.
    pub cpu_tier_ranks: Vec<String>,
    pub kvtrace: OptionExtras,
}

/// `kvcache_run_summary.json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunSummary {
    pub schema_version: &'static str,
    pub run_datetime: String,
    /// Ranks per host, when every host ran as many.
    pub npernode: Option<u32>,
    pub host_count: u32,
    pub total_ranks: u32,
    pub trials_per_option: u32,
    /// By Option number.
    pub options: BTreeMap<String, OptionSummary>,
    pub partial_failure: bool,
}

/// The numbered entries `<prefix><N>` of `dir`, by number; other names are not the layout's
/// and are left alone.
fn numbered(dir: &Path, prefix: &str) -> Result<BTreeMap<u32, PathBuf>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io("cannot list", e).in_file(dir.display()))?;
    let mut out = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("cannot list", e).in_file(dir.display()))?;
        let name = entry.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if entry.path().is_dir() {
            out.insert(n, entry.path());
        }
    }
    Ok(out)
}

/// The results file of a rank directory: its one `kvcache_results_*.json`.
fn result_in(rank_dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(rank_dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kvcache_results_") && n.ends_with(".json"))
        })
        .collect();
    found.sort();
    found.pop()
}

/// Whether `dir` holds an MLPerf run's layout (`option_<O>` directories).
pub fn is_run_dir(dir: &Path) -> bool {
    dir.is_dir() && numbered(dir, "option_").is_ok_and(|o| !o.is_empty())
}

/// The summary of the MLPerf run under `root`, dated `run_datetime`.
pub fn summarize(root: &Path, run_datetime: &str) -> Result<RunSummary> {
    let options = numbered(root, "option_")?;
    if options.is_empty() {
        return Err(Error::usage(format!(
            "{}: no option_<N> directories: not the results of `kvtrace bench --mlperf-option`",
            root.display()
        )));
    }
    let mut summary = RunSummary {
        schema_version: "1.0",
        run_datetime: run_datetime.to_owned(),
        npernode: None,
        host_count: 0,
        total_ranks: 0,
        trials_per_option: 0,
        options: BTreeMap::new(),
        partial_failure: false,
    };
    let mut hosts: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (number, option_dir) in options {
        let option = summarize_option(number, &option_dir, &mut hosts)?;
        summary.total_ranks = summary.total_ranks.max(option.rank_count);
        summary.trials_per_option = summary.trials_per_option.max(option.trial_count);
        summary.partial_failure |= option.partial_failure;
        summary.options.insert(number.to_string(), option);
    }
    summary.host_count = hosts.len() as u32;
    let per_host: BTreeSet<usize> = hosts.values().map(BTreeSet::len).collect();
    if let [n] = per_host.into_iter().collect::<Vec<_>>()[..] {
        summary.npernode = u32::try_from(n).ok();
    }
    Ok(summary)
}

fn summarize_option(
    number: u32,
    dir: &Path,
    hosts: &mut BTreeMap<String, BTreeSet<u32>>,
) -> Result<OptionSummary> {
    let mut o = OptionSummary {
        option: number,
        ..OptionSummary::default()
    };
    let mut open = false;
    for (trial, trial_dir) in numbered(dir, "trial_")? {
        let ranks = numbered(&trial_dir, "rank_")?;
        let mut figures = TrialFigures {
            trial,
            ..TrialFigures::default()
        };
        let mut expected = ranks.keys().next_back().map_or(0, |r| r + 1);
        for (rank, rank_dir) in &ranks {
            let Some(file) = result_in(rank_dir) else {
                o.missing_files.push(rank_dir.display().to_string());
                continue;
            };
            let (shown, doc) = match read_report(&file) {
                Ok(read) => read,
                Err(_) => {
                    o.missing_files.push(file.display().to_string());
                    continue;
                }
            };
            let world_size = doc
                .pointer("/kvtrace/rank/world_size")
                .and_then(Json::as_u64)
                .unwrap_or(1);
            if world_size > u64::from(MAX_RANKS) {
                return Err(Error::bad_input(format!(
                    "{shown}: kvtrace.rank.world_size {world_size} is past {MAX_RANKS}"
                )));
            }
            expected = expected.max(world_size as u32);
            let mlperf = doc.pointer("/kvtrace/mlperf");
            open |= mlperf.and_then(|m| m["division"].as_str()) != Some("closed");
            if let Some(host) = mlperf.and_then(|m| m["host"].as_str()) {
                hosts.entry(host.to_owned()).or_default().insert(*rank);
            }
            let r = RankFigures::read(&doc);
            if r.cpu_tier_only() {
                o.cpu_tier_ranks.push(shown);
            }
            let k = &mut o.kvtrace;
            k.device_read_p95_ms_with_demotions = k
                .device_read_p95_ms_with_demotions
                .max(r.device_read_p95_ms_with_demotions);
            k.device_write_p95_ms_with_demotions = k
                .device_write_p95_ms_with_demotions
                .max(r.device_write_p95_ms_with_demotions);
            figures.add(&r);
        }
        // Ranks a result's world size promises but whose directory never appeared.
        for rank in (0..expected).filter(|r| !ranks.contains_key(r)).take(64) {
            o.missing_files
                .push(trial_dir.join(format!("rank_{rank}")).display().to_string());
        }
        o.rank_count = o.rank_count.max(expected);
        o.aggregated_device_read_p95_ms = o
            .aggregated_device_read_p95_ms
            .max(figures.device_read_p95_ms);
        o.aggregated_device_write_p95_ms = o
            .aggregated_device_write_p95_ms
            .max(figures.device_write_p95_ms);
        o.kvtrace.trials.push(figures);
    }
    let trials = &o.kvtrace.trials;
    o.trial_count = trials.len() as u32;
    let mean = |f: fn(&TrialFigures) -> f64| {
        if trials.is_empty() {
            0.0
        } else {
            trials.iter().map(f).sum::<f64>() / trials.len() as f64
        }
    };
    o.aggregated_read_bandwidth_gbps = mean(|t| t.read_bandwidth_gbps);
    o.aggregated_write_bandwidth_gbps = mean(|t| t.write_bandwidth_gbps);
    o.aggregated_avg_throughput_tokens_per_sec = mean(|t| t.avg_throughput_tokens_per_sec);
    o.aggregated_storage_throughput_tokens_per_sec = mean(|t| t.storage_throughput_tokens_per_sec);
    o.kvtrace.cached_tokens_per_sec = mean(|t| t.cached_tokens_per_sec);
    o.kvtrace.division = if open { "open" } else { "closed" }.to_owned();
    o.partial_failure = !o.missing_files.is_empty() || o.trial_count == 0;
    Ok(o)
}

impl Report for RunSummary {
    fn document(&self) -> Result<Json> {
        super::document(self)
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        let mut options = Table::new(&[
            "option",
            "division",
            "ranks",
            "trials",
            "read_gbps",
            "write_gbps",
            "storage_tokens_per_s",
            "device_read_p95_ms",
            "device_write_p95_ms",
            "cached_tokens_per_s",
            "device_read_p95_ms_with_demotions",
            "device_write_p95_ms_with_demotions",
            "partial_failure",
        ])
        .sheet("Options")
        .csv("kvcache_run_summary_options.csv");
        let mut trials = Table::new(&[
            "option",
            "trial",
            "ranks",
            "read_gbps",
            "write_gbps",
            "storage_tokens_per_s",
            "cached_tokens_per_s",
            "device_read_p95_ms",
            "device_write_p95_ms",
        ])
        .sheet("Trials")
        .csv("kvcache_run_summary_trials.csv");
        for o in self.options.values() {
            options.rows.push(vec![
                Cell::Count(u64::from(o.option)),
                Cell::text(&o.kvtrace.division),
                Cell::Count(u64::from(o.rank_count)),
                Cell::Count(u64::from(o.trial_count)),
                Cell::Number(o.aggregated_read_bandwidth_gbps),
                Cell::Number(o.aggregated_write_bandwidth_gbps),
                Cell::Number(o.aggregated_storage_throughput_tokens_per_sec),
                Cell::Number(o.aggregated_device_read_p95_ms),
                Cell::Number(o.aggregated_device_write_p95_ms),
                Cell::Number(o.kvtrace.cached_tokens_per_sec),
                Cell::Number(o.kvtrace.device_read_p95_ms_with_demotions),
                Cell::Number(o.kvtrace.device_write_p95_ms_with_demotions),
                Cell::Bool(o.partial_failure),
            ]);
            for t in &o.kvtrace.trials {
                trials.rows.push(vec![
                    Cell::Count(u64::from(o.option)),
                    Cell::Count(u64::from(t.trial)),
                    Cell::Count(u64::from(t.ranks)),
                    Cell::Number(t.read_bandwidth_gbps),
                    Cell::Number(t.write_bandwidth_gbps),
                    Cell::Number(t.storage_throughput_tokens_per_sec),
                    Cell::Number(t.cached_tokens_per_sec),
                    Cell::Number(t.device_read_p95_ms),
                    Cell::Number(t.device_write_p95_ms),
                ]);
            }
        }
        vec![options, trials]
    }

    fn terminal(&self) -> String {
        let mut s = format!(
            "MLPerf Storage v3.0 KV-cache run summary (Rules §6.3.4): {} rank(s) on {} host(s), {} trial(s) per Option\n\
             sums over ranks within a trial, means over trials; device P95s the worst rank of any trial\n\
             {:<7} {:<7} {:>10} {:>10} {:>14} {:>11} {:>11} {:>14}\n",
            self.total_ranks,
            self.host_count,
            self.trials_per_option,
            "option",
            "division",
            "read GB/s",
            "write GB/s",
            "storage tok/s",
            "dev rd P95",
            "dev wr P95",
            "cached tok/s",
        );
        for o in self.options.values() {
            s.push_str(&format!(
                "{:<7} {:<7} {:>10.3} {:>10.3} {:>14.1} {:>8.2} ms {:>8.2} ms {:>14.1}\n",
                o.option,
                o.kvtrace.division,
                o.aggregated_read_bandwidth_gbps,
                o.aggregated_write_bandwidth_gbps,
                o.aggregated_storage_throughput_tokens_per_sec,
                o.aggregated_device_read_p95_ms,
                o.aggregated_device_write_p95_ms,
                o.kvtrace.cached_tokens_per_sec,
            ));
            if o.partial_failure {
                s.push_str(&format!(
                    "  option {}: partial failure, {} result(s) missing{}\n",
                    o.option,
                    o.missing_files.len(),
                    o.missing_files
                        .first()
                        .map(|f| format!(" (first: {})", crate::report::terminal::escape_line(f)))
                        .unwrap_or_default()
                ));
            }
            if !o.cpu_tier_ranks.is_empty() {
                s.push_str(&format!(
                    "  option {}: {} rank result(s) held nothing in storage; their device latencies count as 0\n",
                    o.option,
                    o.cpu_tier_ranks.len()
                ));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A rank's result with the figures MLPerf reads; `entries` 0 makes it a CPU-tier rank.
    fn result(read: f64, write: f64, tokens: f64, device_read_p95: f64, entries: u64) -> Json {
        json!({
            "requests_completed": 1,
            "summary": {
                "avg_throughput_tokens_per_sec": 2.0 * tokens,
                "storage_throughput_tokens_per_sec": tokens,
                "cache_stats": {
                    "tier_storage_read_bandwidth_gbps": read,
                    "tier_storage_write_bandwidth_gbps": write,
                    "storage_read_device_p95_ms": device_read_p95,
                    "storage_write_device_p95_ms": 1.0,
                    "storage_entries": entries,
                },
            },
            "kvtrace": {
                "cached_tokens_per_sec": 10.0 * read,
                "rank": {"world_size": 2},
                "mlperf": {"division": "closed", "host": "h"},
                "latency_with_demotions": [
                    {"tier": "storage", "direction": "write", "device_p95_ms": 4.0 + read},
                ],
            },
        })
    }

    fn put(root: &Path, option: u32, trial: u32, rank: u32, doc: &Json) {
        let dir = root.join(format!("option_{option}/trial_{trial}/rank_{rank}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("kvcache_results_1.json"), doc.to_string()).unwrap();
    }

    #[test]
    fn trials_sum_their_ranks_and_the_option_averages_its_trials() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        put(root, 1, 1, 0, &result(1.0, 0.5, 100.0, 20.0, 4));
        put(root, 1, 1, 1, &result(2.0, 0.25, 50.0, 30.0, 4));
        put(root, 1, 2, 0, &result(3.0, 0.5, 10.0, 25.0, 4));
        // Served from memory: its 999 ms is no device latency.
        put(root, 1, 2, 1, &result(0.5, 0.0, 40.0, 999.0, 0));
        std::fs::create_dir_all(root.join("not_an_option")).unwrap();
        let s = summarize(root, "20261125_000000").unwrap();
        assert_eq!((s.total_ranks, s.trials_per_option), (2, 2));
        assert_eq!((s.host_count, s.npernode), (1, Some(2)));
        let o = &s.options["1"];
        // Trial sums: read 3.0 and 3.5, write 0.75 and 0.5, tokens 150 and 50.
        assert_eq!(o.aggregated_read_bandwidth_gbps, 3.25);
        assert_eq!(o.aggregated_write_bandwidth_gbps, 0.625);
        assert_eq!(o.aggregated_storage_throughput_tokens_per_sec, 100.0);
        assert_eq!(o.aggregated_avg_throughput_tokens_per_sec, 200.0);
        assert_eq!(o.kvtrace.cached_tokens_per_sec, 32.5);
        assert_eq!(o.aggregated_device_read_p95_ms, 30.0);
        assert_eq!(o.aggregated_device_write_p95_ms, 1.0);
        assert_eq!(o.kvtrace.device_write_p95_ms_with_demotions, 7.0);
        assert_eq!(o.cpu_tier_ranks.len(), 1);
        assert!(o.cpu_tier_ranks[0].ends_with("trial_2/rank_1/kvcache_results_1.json"));
        assert_eq!(o.kvtrace.division, "closed");
        assert!(!o.partial_failure && !s.partial_failure);
        assert_eq!(o.kvtrace.trials[1].read_bandwidth_gbps, 3.5);
    }

    #[test]
    fn a_rank_missing_or_unreadable_is_listed_and_a_forged_world_size_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut three = result(1.0, 1.0, 1.0, 1.0, 1);
        three["kvtrace"]["rank"]["world_size"] = json!(3);
        three["kvtrace"]["mlperf"]["division"] = json!("open");
        put(root, 2, 1, 0, &three);
        let torn = root.join("option_2/trial_1/rank_1");
        std::fs::create_dir_all(&torn).unwrap();
        std::fs::write(torn.join("kvcache_results_2.json"), "{\"summ").unwrap();
        let s = summarize(root, "d").unwrap();
        let o = &s.options["2"];
        assert!(o.partial_failure && s.partial_failure);
        assert_eq!(o.rank_count, 3);
        assert_eq!(o.missing_files.len(), 2, "{:?}", o.missing_files);
        assert!(o.missing_files[0].ends_with("rank_1/kvcache_results_2.json"));
        assert!(o.missing_files[1].ends_with("trial_1/rank_2"));
        assert_eq!(o.kvtrace.division, "open");
        assert!(s
            .terminal()
            .contains("option 2: partial failure, 2 result(s) missing"));
        three["kvtrace"]["rank"]["world_size"] = json!(u64::from(u32::MAX) + 7);
        put(root, 2, 1, 0, &three);
        let e = summarize(root, "d").unwrap_err().to_string();
        assert!(
            e.contains("kvtrace.rank.world_size 4294967302 is past"),
            "{e}"
        );
        assert!(
            summarize(&root.join("option_2"), "d").is_err(),
            "no option_ inside"
        );
    }
}
