//! The flags of rank mode, shared by `replay` and `bench`.

use std::path::Path;
use std::time::Duration;

use kvtrace::error::{Error, Result};
use kvtrace::rank::barrier::Barrier;
use kvtrace::rank::{launcher_run_id, Given, Rank};

use super::tiers::positive;

#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "Rank mode (many processes, one run)")]
pub(super) struct RankArgs {
    /// This process's rank; without it, the launcher's (OMPI_COMM_WORLD_RANK, PMI_RANK,
    /// SLURM_PROCID, JOB_COMPLETION_INDEX)
    #[arg(long, value_name = "N")]
    pub rank: Option<u32>,
    /// How many ranks the run has; without it, the launcher's (needed for a Kubernetes
    /// indexed Job)
    #[arg(long, value_name = "N")]
    pub world_size: Option<u32>,
    /// Names this run at the start barrier (unique per run); without it, the launcher's job
    /// id (Open MPI, Slurm, PMI)
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// How long a rank waits for the others at the start barrier
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    pub barrier_timeout: f64,
    /// Where the ranks meet at the start barrier: a directory every rank sees (default: the
    /// output directory)
    #[arg(long, value_name = "DIR")]
    pub barrier_dir: Option<std::path::PathBuf>,
}

impl RankArgs {
    /// This process's rank, from the flags or the launcher's environment; `None` when it
    /// runs on its own.
    pub(super) fn rank(&self) -> Result<Option<Rank>> {
        let given = Given {
            rank: self.rank,
            world_size: self.world_size,
            rank_name: "--rank",
            world_size_name: "--world-size",
        };
        Rank::detect(&given, |name| std::env::var(name).ok())
    }

    /// The start barrier of `rank`, meeting under `--barrier-dir` or `default_dir`; none
    /// for a run of one.
    pub(super) fn barrier(&self, rank: &Rank, default_dir: &Path) -> Result<Option<Barrier>> {
        self.barrier_under(rank, default_dir, Path::new(""))
    }

    /// As [`RankArgs::barrier`], meeting in `sub` under the directory: one barrier of many
    /// in one run (each trial of an MLPerf run starts at its own).
    pub(super) fn barrier_under(
        &self,
        rank: &Rank,
        default_dir: &Path,
        sub: &Path,
    ) -> Result<Option<Barrier>> {
        if !positive(self.barrier_timeout) {
            return Err(Error::usage(format!(
                "--barrier-timeout {}: must be a positive number of seconds",
                self.barrier_timeout
            )));
        }
        if rank.world_size < 2 {
            return Ok(None);
        }
        let run_id = match &self.run_id {
            Some(id) => id.clone(),
            None => launcher_run_id(|name| std::env::var(name).ok()).ok_or_else(|| {
                Error::usage(format!(
                    "rank {} of {} from {}: give --run-id (one per run) so the ranks can meet at the start barrier",
                    rank.rank, rank.world_size, rank.source
                ))
            })?,
        };
        let base = self.barrier_dir.as_deref().unwrap_or(default_dir);
        let dir = match sub.as_os_str().is_empty() {
            true => base.to_path_buf(),
            false => base.join(sub),
        };
        Barrier::new(
            &dir,
            &run_id,
            rank,
            Duration::from_secs_f64(self.barrier_timeout.min(1e6)),
        )
        .map(Some)
    }
}
