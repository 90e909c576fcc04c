//! MLPerf Storage v3.0's KV-cache workload Options (its `Rules.md` §6.3): three fixed
//! workloads, each run a fixed number of trials with a fixed seed and a pause between
//! Options, every rank's results in `option_<O>/trial_<T>/rank_<N>/` so that the run's
//! summary (`kvtrace_rank::aggregate::mlperf`) can find them.
//!
//! In the CLOSED division nothing but where the files go and how many ranks run may
//! change; an OPEN run may supersede any parameter, one at a time. This module holds the
//! values and the layout; the caller decides which parameters its user set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::models::model;
use super::plan::{Generation, Setup};
use kvtrace_rank::Rank;

/// The seed every CLOSED run uses.
pub const CLOSED_SEED: u64 = 42;
/// Scored repeats of each Option in a CLOSED run.
pub const CLOSED_TRIALS: u32 = 3;
/// The pause between two Options of a CLOSED run.
pub const CLOSED_INTER_OPTION_DELAY: Duration = Duration::from_secs(90);

/// One sanctioned workload (Table KVCache-1). Every Option removes the GPU tier and the
/// simulated generation time, so what is measured is the storage.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadOption {
    pub number: u32,
    pub name: &'static str,
    pub model: &'static str,
    /// Users per rank: adding ranks adds load.
    pub users: u32,
    pub duration: Duration,
    pub gpu_mem_gb: f64,
    pub cpu_mem_gb: f64,
    pub max_concurrent_allocs: u32,
}

pub const OPTIONS: [WorkloadOption; 3] = [
    WorkloadOption {
        number: 1,
        name: "Max Storage Stress",
        model: "llama3.1-8b",
        users: 200,
        duration: Duration::from_secs(300),
        gpu_mem_gb: 0.0,
        cpu_mem_gb: 0.0,
        max_concurrent_allocs: 16,
    },
    WorkloadOption {
        number: 2,
        name: "Storage Throughput",
        model: "llama3.1-8b",
        users: 100,
        duration: Duration::from_secs(300),
        gpu_mem_gb: 0.0,
        cpu_mem_gb: 4.0,
        max_concurrent_allocs: 16,
    },
    WorkloadOption {
        number: 3,
        name: "Large Model (70B)",
        model: "llama3.1-70b-instruct",
        users: 70,
        duration: Duration::from_secs(300),
        gpu_mem_gb: 0.0,
        cpu_mem_gb: 0.0,
        max_concurrent_allocs: 4,
    },
];

/// A parameter an Option fixes; an OPEN run may keep the user's value of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    Model,
    Users,
    Duration,
    GpuMemGb,
    CpuMemGb,
    MaxConcurrentAllocs,
    Generation,
    Seed,
}

impl Param {
    pub const ALL: [Param; 8] = [
        Param::Model,
        Param::Users,
        Param::Duration,
        Param::GpuMemGb,
        Param::CpuMemGb,
        Param::MaxConcurrentAllocs,
        Param::Generation,
        Param::Seed,
    ];
}

impl WorkloadOption {
    /// Option `number` (1, 2 or 3).
    pub fn get(number: u32) -> Option<&'static WorkloadOption> {
        OPTIONS.iter().find(|o| o.number == number)
    }

    /// `setup` with this Option's values, except those `keep` says the user set (an OPEN
    /// run's supersedes).
    pub fn apply(&self, setup: &Setup, keep: impl Fn(Param) -> bool) -> Setup {
        let mut s = setup.clone();
        for p in Param::ALL.into_iter().filter(|&p| !keep(p)) {
            match p {
                Param::Model => {
                    s.model = *model(self.model).expect("the Options name known models")
                }
                Param::Users => s.users = self.users,
                Param::Duration => s.duration = self.duration,
                Param::GpuMemGb => s.gpu_mem_gb = self.gpu_mem_gb,
                Param::CpuMemGb => s.cpu_mem_gb = self.cpu_mem_gb,
                Param::MaxConcurrentAllocs => s.max_concurrent_allocs = self.max_concurrent_allocs,
                Param::Generation => s.generation = Generation::None,
                Param::Seed => s.seed = CLOSED_SEED,
            }
        }
        s
    }
}

/// Which MLPerf division a run belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Division {
    /// Every parameter as the rules fix it.
    Closed,
    /// Some parameter changed: not comparable with CLOSED results.
    Open,
}

/// One trial of one Option as it appears in a rank's results.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MlperfTrial {
    pub division: Division,
    pub option: u32,
    pub trial: u32,
    /// The host the rank ran on: the summary counts hosts by it.
    pub host: String,
}

/// The directory of one rank's results of one trial: `option_<O>/trial_<T>/rank_<N>`
/// under `results` (rank 0 for a run of one process).
pub fn rank_dir(results: &Path, option: u32, trial: u32, rank: Option<&Rank>) -> PathBuf {
    results
        .join(format!("option_{option}"))
        .join(format!("trial_{trial}"))
        .join(format!("rank_{}", rank.map_or(0, |r| r.rank)))
}

/// This machine's host name, as the kernel has it; `unknown` where it cannot be read.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_option_fixes_every_workload_parameter_and_an_open_one_keeps_the_users() {
        let user = Setup {
            users: 3,
            seed: 7,
            cpu_mem_gb: 1.0,
            ..Setup::default()
        };
        let closed = WorkloadOption::get(2).unwrap().apply(&user, |_| false);
        assert_eq!(closed.model.name, "llama3.1-8b");
        assert_eq!(
            (closed.users, closed.seed, closed.max_concurrent_allocs),
            (100, 42, 16)
        );
        assert_eq!((closed.gpu_mem_gb, closed.cpu_mem_gb), (0.0, 4.0));
        assert_eq!(closed.generation, Generation::None);
        assert_eq!(closed.duration, Duration::from_secs(300));
        let open = WorkloadOption::get(3)
            .unwrap()
            .apply(&user, |p| matches!(p, Param::Users | Param::Seed));
        assert_eq!((open.users, open.seed), (3, 7), "the user's values stay");
        assert_eq!(open.model.name, "llama3.1-70b-instruct");
        assert_eq!((open.cpu_mem_gb, open.max_concurrent_allocs), (0.0, 4));
        assert!(WorkloadOption::get(4).is_none());
    }

    #[test]
    fn each_rank_of_each_trial_has_its_own_directory() {
        let rank = Rank {
            rank: 3,
            world_size: 4,
            source: "--rank".into(),
        };
        assert_eq!(
            rank_dir(Path::new("r"), 2, 1, Some(&rank)),
            Path::new("r/option_2/trial_1/rank_3")
        );
        assert_eq!(
            rank_dir(Path::new("r"), 1, 3, None),
            Path::new("r/option_1/trial_3/rank_0")
        );
    }
}
