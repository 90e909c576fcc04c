//! `bench --suite`: nine scenarios sized to this machine, each a change of one base run, and
//! one comparison table of what they measured.

use std::path::PathBuf;

use super::autoscale::AutoscaleMode;
use std::time::Duration;

use super::plan::Setup;
use super::report::BenchReport;
use super::run::{DecodeReads, MultiTurn};
use super::tiers::TierKind;
use kvtrace_cache::clock::local_stamp;
use kvtrace_io::error::Result;
use kvtrace_io::machine::available_memory;

/// A scenario: a name, what it shows, and how it changes the base run.
pub struct Scenario {
    pub name: &'static str,
    pub what: &'static str,
    change: fn(&mut Setup),
}

pub const SCENARIOS: [Scenario; 9] = [
    Scenario {
        name: "storage-only",
        what: "no CPU tier: every byte is storage I/O",
        change: |o| o.cpu_mem_gb = 0.0,
    },
    Scenario {
        name: "tiered",
        what: "CPU tier in front of storage (waterfall)",
        change: |_| {},
    },
    Scenario {
        name: "gpu-cpu-storage",
        what: "a modelled GPU tier on top",
        change: |o| o.gpu_tier = true,
    },
    Scenario {
        name: "no-prefix-caching",
        what: "shared prefixes recomputed",
        change: |o| o.prefix_caching = false,
    },
    Scenario {
        name: "single-turn",
        what: "no conversation history reads",
        change: |o| o.multi_turn = MultiTurn::Off,
    },
    Scenario {
        name: "single-decode-read",
        what: "decode reads each entry once",
        change: |o| o.decode_reads = DecodeReads::Single,
    },
    Scenario {
        name: "rag",
        what: "document retrieval on one request in ten",
        change: |o| o.rag = true,
    },
    Scenario {
        name: "autoscale-qos",
        what: "users follow storage saturation",
        change: |o| o.autoscale = Some(AutoscaleMode::Qos),
    },
    Scenario {
        name: "capacity",
        what: "users grow until throughput stops improving",
        change: |o| o.autoscale = Some(AutoscaleMode::Capacity),
    },
];

/// The suite's base run and where its reports go.
pub struct Suite {
    pub cores: usize,
    pub memory_gib: f64,
    pub users: u32,
    pub cpu_gb: f64,
    pub dir: PathBuf,
    base: Setup,
}

impl Suite {
    /// Sizes the base run to this machine: at most 8 users a core, a CPU tier of a quarter
    /// of the available memory (0.5 to 32 GiB, no more than asked for); one JSON report per
    /// scenario in the directory `setup.output` names (`kvtrace_suite_<local time>` when
    /// it names none), created here; nothing else written.
    pub fn create(setup: &Setup) -> Result<Suite> {
        let dir = setup
            .output
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("kvtrace_suite_{}", local_stamp())));
        kvtrace_io::output::create_dir(&dir)?;
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let memory_gib = available_memory().unwrap_or(8 << 30) as f64 / (1u64 << 30) as f64;
        let users = setup
            .users
            .min(u32::try_from(8 * cores).unwrap_or(u32::MAX))
            .max(1);
        let cpu_gb = (memory_gib / 4.0)
            .clamp(0.5, 32.0)
            .min(setup.cpu_mem_gb.max(0.5));
        let base = Setup {
            users,
            cpu_mem_gb: cpu_gb,
            xlsx_output: None,
            csv: None,
            parquet: None,
            record: None,
            io_trace_log: None,
            autoscale_interval: (setup.duration / 6).max(Duration::from_secs(1)),
            ..setup.clone()
        };
        Ok(Suite {
            cores,
            memory_gib,
            users,
            cpu_gb,
            dir,
            base,
        })
    }

    /// One line saying how the suite sized itself and where its reports go.
    pub fn describe(&self) -> String {
        format!(
            "suite on {} cores, {:.0} GiB available: {} users, {:.1} GiB CPU tier, {} s per scenario; reports in {}",
            self.cores,
            self.memory_gib,
            self.users,
            self.cpu_gb,
            self.base.duration.as_secs_f64(),
            self.dir.display()
        )
    }

    /// The setup of one scenario.
    pub fn setup(&self, scenario: &Scenario) -> Setup {
        let mut o = self.base.clone();
        (scenario.change)(&mut o);
        o.output = Some(self.report_path(scenario.name));
        o
    }

    fn report_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    pub fn header() -> &'static str {
        "scenario              requests   tok/s  storage GiB/s  E2E p95 ms  read p95 ms  hit rate  assessment\n"
    }

    /// One row of the comparison table.
    pub fn row(name: &str, r: &BenchReport) -> String {
        let s = &r.summary;
        let read_p95 = s
            .cache_stats
            .tier(TierKind::Storage)
            .and_then(|t| t.read.as_ref())
            .map_or(0.0, |o| o.total.0[1]);
        format!(
            "{name:<20} {:>9} {:>7.1} {:>14.3} {:>11.1} {:>12.1} {:>8.1}%  {}\n",
            s.total_requests,
            s.avg_throughput_tokens_per_sec,
            r.kvtrace.storage_io_throughput_gib_per_s,
            s.end_to_end_latency_ms.p95,
            read_p95,
            100.0 * s.cache_stats.cache_hit_rate,
            s.cache_stats.storage_health.overall_status,
        )
    }
}
